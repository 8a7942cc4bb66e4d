// SPDX-License-Identifier: Apache-2.0
#include "compress/two_bit.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "pushpull/error.h"

namespace pushpull::compress {
namespace {

TEST(TwoBit, PacksSixteenValuesPerWord) {
  EXPECT_EQ(TwoBitCodec::compressed_bytes(0), 0u);
  EXPECT_EQ(TwoBitCodec::compressed_bytes(1), 4u);
  EXPECT_EQ(TwoBitCodec::compressed_bytes(16), 4u);
  EXPECT_EQ(TwoBitCodec::compressed_bytes(17), 8u);
  TwoBitCodec c(0.5f);
  std::vector<float> g = {0.6f, -0.7f, 0.1f, 0.5f, -0.5f};
  std::vector<float> r(g.size(), 0.0f);
  uint32_t word = 0xffffffff;
  c.compress(g.data(), r.data(), &word, g.size());
  // codes: +t, -t, 0, +t, -t → 01 10 00 01 10 (value 0 in the low bits)
  EXPECT_EQ(word, 0b10'01'00'10'01u);
  EXPECT_FLOAT_EQ(r[0], 0.1f);
  EXPECT_FLOAT_EQ(r[1], -0.2f);
  EXPECT_FLOAT_EQ(r[2], 0.1f);
  EXPECT_FLOAT_EQ(r[3], 0.0f);
  std::vector<float> out(g.size());
  c.decompress(&word, out.data(), out.size());
  EXPECT_EQ(out, (std::vector<float>{0.5f, -0.5f, 0.0f, 0.5f, -0.5f}));
}

TEST(TwoBit, BelowThresholdAccumulatesUntilItCrosses) {
  TwoBitCodec c(1.0f);
  std::vector<float> g(20, 0.3f), r(20, 0.0f), acc(20, 0.0f);
  std::vector<uint32_t> words(TwoBitCodec::compressed_bytes(20) / 4);
  for (int step = 1; step <= 3; ++step) {
    c.compress(g.data(), r.data(), words.data(), g.size());
    c.decompress_add(words.data(), acc.data(), acc.size());
    EXPECT_EQ(acc[19], 0.0f) << "step " << step;  // 0.3, 0.6, 0.9 stay below t
  }
  c.compress(g.data(), r.data(), words.data(), g.size());  // 1.2 crosses
  c.decompress_add(words.data(), acc.data(), acc.size());
  EXPECT_EQ(acc[0], 1.0f);
  EXPECT_NEAR(r[0], 0.2f, 1e-6);
}

TEST(TwoBit, MatchesReferenceQuantiserOnRandomGradients) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const float t = 0.7f;
  TwoBitCodec c(t);
  const size_t n = 1001;
  std::vector<float> r(n, 0.0f), ref_r(n, 0.0f);
  std::vector<uint32_t> words(TwoBitCodec::compressed_bytes(n) / 4);
  std::vector<float> out(n);
  for (int step = 0; step < 5; ++step) {
    std::vector<float> g(n);
    for (auto& v : g)
      v = dist(rng);
    c.compress(g.data(), r.data(), words.data(), n);
    c.decompress(words.data(), out.data(), n);
    for (size_t i = 0; i < n; ++i) {
      float x = ref_r[i] + g[i];
      float q = x >= t ? t : (x <= -t ? -t : 0.0f);
      ref_r[i] = x - q;
      ASSERT_EQ(out[i], q) << "step " << step << " i " << i;
      ASSERT_FLOAT_EQ(r[i], ref_r[i]);
    }
  }
}

TEST(TwoBit, RejectsBadThreshold) {
  EXPECT_THROW(TwoBitCodec(0.0f), InvalidArgument);
  EXPECT_THROW(TwoBitCodec(-1.0f), InvalidArgument);
}

}  // namespace
}  // namespace pushpull::compress
