// SPDX-License-Identifier: Apache-2.0
#include "pushpull/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "pushpull/array.h"

namespace pushpull {
namespace {

double apply(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kProd:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  return 0;
}

class KernelTest : public ::testing::TestWithParam<std::tuple<DType, ReduceOp, int64_t>> {};

TEST_P(KernelTest, MatchesReference) {
  auto [dtype, op, n] = GetParam();
  Array a(Shape{n}, dtype), b(Shape{n}, dtype);
  std::mt19937 rng(static_cast<unsigned>(n));
  // Small integers keep every dtype exact (also int8 products and fp16 sums).
  for (int64_t i = 0; i < n; ++i) {
    set_element(a, i, static_cast<double>(rng() % 5) + (dtype == DType::kUInt8 ? 0 : -2.0 * 0));
    set_element(b, i, static_cast<double>(rng() % 5));
  }
  std::vector<double> expect(n);
  for (int64_t i = 0; i < n; ++i)
    expect[i] = apply(op, get_element(a, i), get_element(b, i));
  reduce(op, dtype, a.data(), b.data(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(get_element(a, i), expect[i]) << "at " << i;
}

INSTANTIATE_TEST_SUITE_P(AllTypes, KernelTest,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16,
                                                              DType::kBFloat16, DType::kFloat64,
                                                              DType::kInt32, DType::kInt64,
                                                              DType::kInt8, DType::kUInt8),
                                            ::testing::Values(ReduceOp::kSum, ReduceOp::kProd,
                                                              ReduceOp::kMin, ReduceOp::kMax),
                                            ::testing::Values(0, 1, 7, 4099)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  std::string(reduce_op_name(std::get<1>(info.param))) + "_" +
                                  std::to_string(std::get<2>(info.param));
                         });

TEST(Kernels, HalfSumsInFloat32) {
  // 2048 + 1 is not representable in fp16 (spacing 2); summing in float32 and
  // rounding once gives 2048 + 1 + 1 = 2050 exactly when done in two steps.
  Array a = Array::full(Shape{3}, 2048.0, DType::kFloat16);
  Array b = Array::full(Shape{3}, 3.0, DType::kFloat16);
  reduce_sum(DType::kFloat16, a.data(), b.data(), 3);
  EXPECT_EQ(get_element(a, 0), 2052.0);  // 2051 rounds to even 2052
}

TEST(Kernels, ScaleByOneOverKDividesByK) {
  // An average over 3 ranks: the sum times 1/3 must be the correctly rounded
  // quotient x / 3, which x * (1/3), the factor itself rounded, is not for a
  // third of these x (float 142: 47.333336, not 47.333332); integers: 9 / 3
  // is 3, where 9 * (1/3) truncates to 2.
  std::vector<double> xs;
  for (int v = -200; v <= 200; ++v)
    xs.push_back(v);
  const int64_t n = static_cast<int64_t>(xs.size());
  Array f(Shape{n}, DType::kFloat32), d(Shape{n}, DType::kFloat64);
  std::copy(xs.begin(), xs.end(), f.as<float>());
  std::copy(xs.begin(), xs.end(), d.as<double>());
  scale(DType::kFloat32, f.data(), 1.0 / 3.0, xs.size());
  scale(DType::kFloat64, d.data(), 1.0 / 3.0, xs.size());
  int f_off = 0, d_off = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float x = static_cast<float>(xs[i]);
    EXPECT_EQ(f.as<float>()[i], x / 3.0f) << x;
    EXPECT_EQ(d.as<double>()[i], xs[i] / 3.0) << x;
    f_off += x * static_cast<float>(1.0 / 3.0) != x / 3.0f;
    d_off += xs[i] * (1.0 / 3.0) != xs[i] / 3.0;
  }
  EXPECT_GT(f_off, 0) << "the values must include some the factor gets wrong";
  EXPECT_GT(d_off, 0);
  Array i = Array::full(Shape{2}, 9.0, DType::kInt32);
  scale(DType::kInt32, i.data(), 1.0 / 3.0, 2);
  EXPECT_EQ(get_element(i, 1), 3.0);
  // Any other factor multiplies (for float32 by the factor as a float).
  Array g = Array::full(Shape{1}, 3.0, DType::kFloat32);
  scale(DType::kFloat32, g.data(), 0.2915, 1);
  EXPECT_EQ(g.as<float>()[0], 3.0f * 0.2915f);
}

TEST(Kernels, ScaleAndConvert) {
  Array a = Array::full(Shape{5}, 3.0, DType::kBFloat16);
  scale(DType::kBFloat16, a.data(), 0.5, 5);
  EXPECT_EQ(get_element(a, 4), 1.5);
  Array i = Array::full(Shape{2}, 7.0, DType::kInt32);
  scale(DType::kInt32, i.data(), 0.5, 2);
  EXPECT_EQ(get_element(i, 0), 3.0);
  Array f(Shape{4}, DType::kFloat32);
  Array h = Array::full(Shape{4}, 0.25, DType::kFloat16);
  convert(DType::kFloat32, f.data(), DType::kFloat16, h.data(), 4);
  EXPECT_EQ(f.as<float>()[3], 0.25f);
  Array d(Shape{4}, DType::kFloat64);
  convert(DType::kFloat64, d.data(), DType::kFloat16, h.data(), 4);
  EXPECT_EQ(d.as<double>()[0], 0.25);
}

TEST(Kernels, Identity) {
  Array a(Shape{3}, DType::kFloat32);
  fill_identity(ReduceOp::kMin, DType::kFloat32, a.data(), 3);
  EXPECT_TRUE(std::isinf(a.as<float>()[0]));
  Array b(Shape{3}, DType::kInt8);
  fill_identity(ReduceOp::kMax, DType::kInt8, b.data(), 3);
  EXPECT_EQ(b.as<int8_t>()[2], -128);
  fill_identity(ReduceOp::kProd, DType::kInt8, b.data(), 3);
  EXPECT_EQ(b.as<int8_t>()[1], 1);
  EXPECT_EQ(parse_reduce_op("max"), ReduceOp::kMax);
  EXPECT_FALSE(parse_reduce_op("avg").has_value());
}

}  // namespace
}  // namespace pushpull
