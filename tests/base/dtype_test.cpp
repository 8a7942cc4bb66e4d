// SPDX-License-Identifier: Apache-2.0
#include "pushpull/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace pushpull {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat64), 8u);
  EXPECT_EQ(dtype_size(DType::kInt32), 4u);
  EXPECT_EQ(dtype_size(DType::kInt64), 8u);
  EXPECT_EQ(dtype_size(DType::kInt8), 1u);
  EXPECT_EQ(dtype_size(DType::kUInt8), 1u);
  for (int i = 0; i < kNumDTypes; ++i) {
    auto t = static_cast<DType>(i);
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  }
  EXPECT_EQ(parse_dtype("fp16"), DType::kFloat16);
  EXPECT_FALSE(parse_dtype("complex64").has_value());
  EXPECT_FALSE(is_valid_dtype(8));
}

TEST(Half, ExactValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(1e6f), 0x7c00);  // overflow → inf
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(5.9604645e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  EXPECT_EQ(half_to_float(0x0001), 5.9604645e-08f);
  EXPECT_TRUE(std::isinf(half_to_float(0x7c00)));
}

TEST(Half, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), h) << std::hex << h;
  }
}

TEST(Half, BulkMatchesScalarOnRandomFloats) {
  // The F16C path (when present) and the portable path must agree bit for bit.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-70000.f, 70000.f);
  std::vector<float> src(1003);
  for (auto& v : src)
    v = dist(rng) * (rng() % 2 ? 1e-6f : 1.f);
  src[0] = 6.1e-5f;  // near the subnormal boundary
  std::vector<uint16_t> h(src.size());
  float_to_half(src.data(), h.data(), src.size());
  std::vector<float> back(src.size());
  half_to_float(h.data(), back.data(), h.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(h[i], float_to_half(src[i])) << src[i];
    ASSERT_EQ(back[i], half_to_float(h[i]));
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(bfloat16_to_float(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly half way between two bf16 values: ties to even (1.0).
  EXPECT_EQ(float_to_bfloat16(1.00390625f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::nanf("")))));
  std::vector<float> src = {0.5f, -3.25f, 1e30f};
  std::vector<uint16_t> b(3);
  float_to_bfloat16(src.data(), b.data(), 3);
  std::vector<float> back(3);
  bfloat16_to_float(b.data(), back.data(), 3);
  EXPECT_EQ(back[0], 0.5f);
  EXPECT_EQ(back[1], -3.25f);
  EXPECT_NEAR(back[2], 1e30f, 1e28f);
}

}  // namespace
}  // namespace pushpull
