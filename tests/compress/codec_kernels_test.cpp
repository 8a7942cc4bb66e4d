// SPDX-License-Identifier: Apache-2.0
// The vectorised packed codecs (compress/kernels.h) against the scalar
// definitions (compress/reference.h), bit for bit: encoded words, residuals
// after several rounds, decoded sums; random and adversarial inputs (values
// on the threshold, ±0, NaN, infinities), odd lengths around the block and
// word sizes, several thresholds. And the in-place decode of a compressed
// pull reply (compress/compressor.h decode_in_place).
#include "compress/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "compress/codec.h"
#include "compress/compressor.h"
#include "compress/reference.h"

namespace pushpull::compress {
namespace {

std::vector<float> gradients(size_t n, float t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, std::max(std::fabs(t), 0.1f));
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    switch (rng() % 16) {  // every branch of the scalar code, and the edges
      case 0:
        g[i] = t;
        break;
      case 1:
        g[i] = -t;
        break;
      case 2:
        g[i] = (rng() & 1) ? 0.0f : -0.0f;
        break;
      case 3:
        g[i] = rng() % 8 == 0 ? std::numeric_limits<float>::quiet_NaN()
                              : std::numeric_limits<float>::infinity() * ((rng() & 1) ? 1 : -1);
        break;
      default:
        g[i] = normal(rng);
    }
  }
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp must not see the null data() of empty vectors (UBSan).
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

const size_t kSizes[] = {0, 1, 15, 16, 17, 31, 33, 255, 256, 257, 1000, 4095, 4097, 70001};

TEST(Kernels, TwoBitMatchesTheScalarDefinitionBitForBit) {
  for (float t : {0.5f, 1e-3f, 3.0f, 1e30f})
    for (size_t n : kSizes) {
      std::vector<float> r1(n, 0.0f), r2(n, 0.0f), a1(n, 0.25f), a2(n, 0.25f), d(n, 7.0f);
      const size_t bytes = (n + 15) / 16 * 4;
      for (uint32_t round = 0; round < 3; ++round) {  // residuals carry between rounds
        const auto g = gradients(n, t, static_cast<uint32_t>(n * 7 + round));
        std::vector<std::byte> o1(bytes, std::byte{0xAB}), o2(bytes, std::byte{0xCD});
        reference::two_bit_encode(g.data(), r1.data(), o1.data(), n, t);
        kernels::two_bit_encode(g.data(), r2.data(), o2.data(), n, t);
        ASSERT_EQ(o1, o2) << "t " << t << " n " << n << " round " << round;
        ASSERT_TRUE(same_bits(r1, r2)) << "t " << t << " n " << n << " round " << round;
        reference::two_bit_decode_add(o1.data(), a1.data(), n, t);
        kernels::two_bit_decode_add(o1.data(), a2.data(), n, t);
        ASSERT_TRUE(same_bits(a1, a2)) << "t " << t << " n " << n;
        std::vector<float> zero(n, 0.0f);
        reference::two_bit_decode_add(o1.data(), zero.data(), n, t);
        kernels::two_bit_decode(o1.data(), d.data(), n, t);
        ASSERT_TRUE(same_bits(zero, d)) << "t " << t << " n " << n;
      }
    }
}

TEST(Kernels, OneBitMatchesTheScalarDefinitionBitForBit) {
  for (float t : {0.0f, 0.5f, -0.75f, 2.0f})
    for (size_t n : kSizes) {
      std::vector<float> r1(n, 0.0f), r2(n, 0.0f), a1(n, -0.5f), a2(n, -0.5f), d(n, 7.0f);
      const size_t bytes = (n + 31) / 32 * 4;
      for (uint32_t round = 0; round < 3; ++round) {
        const auto g = gradients(n, t, static_cast<uint32_t>(n * 13 + round));
        std::vector<std::byte> o1(bytes, std::byte{0xAB}), o2(bytes, std::byte{0xCD});
        reference::one_bit_encode(g.data(), r1.data(), o1.data(), n, t);
        kernels::one_bit_encode(g.data(), r2.data(), o2.data(), n, t);
        ASSERT_EQ(o1, o2) << "t " << t << " n " << n << " round " << round;
        ASSERT_TRUE(same_bits(r1, r2)) << "t " << t << " n " << n << " round " << round;
        reference::one_bit_decode_add(o1.data(), a1.data(), n);
        kernels::one_bit_decode_add(o1.data(), a2.data(), n);
        ASSERT_TRUE(same_bits(a1, a2)) << "t " << t << " n " << n;
        std::vector<float> zero(n, 0.0f);
        reference::one_bit_decode_add(o1.data(), zero.data(), n);
        kernels::one_bit_decode(o1.data(), d.data(), n);
        ASSERT_TRUE(same_bits(zero, d)) << "t " << t << " n " << n;
      }
    }
}

TEST(Kernels, Fp16MatchesTheScalarDefinitionBitForBit) {
  for (size_t n : kSizes) {
    std::vector<float> r1(n, 0.0f), r2(n, 0.0f);
    for (uint32_t round = 0; round < 3; ++round) {
      auto g = gradients(n, 0.5f, static_cast<uint32_t>(n * 3 + round));
      for (size_t i = 0; i < n; i += 7)  // beyond float16's range, and subnormal halves
        g[i] = (i % 2 ? 1e6f : -7e4f) * (round + 1) + (i % 3 ? 0.0f : 1e-6f);
      std::vector<std::byte> o1(2 * n, std::byte{0xAB}), o2(2 * n, std::byte{0xCD});
      reference::fp16_encode(g.data(), r1.data(), o1.data(), n);
      kernels::fp16_encode(g.data(), r2.data(), o2.data(), n);
      ASSERT_EQ(o1, o2) << "n " << n << " round " << round;
      ASSERT_TRUE(same_bits(r1, r2)) << "n " << n << " round " << round;
    }
  }
}

// A server's one-pass encode (Codec::compress_keep) equals encode then
// decode: the same bytes, residual and decoded values, bit for bit.
TEST(Kernels, CompressKeepEqualsCompressThenDecompress) {
  for (const char* type : {"2bit", "1bit", "fp16"})
    for (size_t n : kSizes) {
      std::map<std::string, std::string> p{{"type", type}};
      const auto codec = make_codec(parse_settings(p));
      std::vector<float> r1(n, 0.0f), r2(n, 0.0f);
      for (uint32_t round = 0; round < 3; ++round) {
        auto v1 = gradients(n, 0.5f, static_cast<uint32_t>(n * 5 + round));
        for (size_t i = 0; i < n; i += 11)
          v1[i] = 1e5f * static_cast<float>(round + 1);  // beyond float16's range
        auto v2 = v1;
        std::vector<std::byte> o1(codec->compressed_bytes(n)), o2(o1.size(), std::byte{0xCD});
        codec->compress(v1.data(), r1.data(), o1.data(), n);
        codec->decompress(o1.data(), v1.data(), n);
        codec->compress_keep(v2.data(), r2.data(), o2.data(), n);
        ASSERT_EQ(o1, o2) << type << " n " << n;
        ASSERT_TRUE(same_bits(r1, r2)) << type << " n " << n;
        ASSERT_TRUE(same_bits(v1, v2)) << type << " n " << n;
      }
    }
}

// Untrusted words: every 2-bit code, the unused code 3 and set padding bits
// decode as the scalar table does (3 and padding: nothing).
TEST(Kernels, DecodersReadEveryBitPatternAsTheScalarDefinition) {
  std::mt19937 rng(5);
  for (size_t n : kSizes) {
    std::vector<std::byte> words((n + 15) / 16 * 4);
    for (auto& b : words)
      b = static_cast<std::byte>(rng());
    std::vector<float> a1(n, 1.0f), a2(n, 1.0f);
    reference::two_bit_decode_add(words.data(), a1.data(), n, 0.5f);
    kernels::two_bit_decode_add(words.data(), a2.data(), n, 0.5f);
    ASSERT_TRUE(same_bits(a1, a2)) << n;
    reference::one_bit_decode_add(words.data(), a1.data(), n);
    kernels::one_bit_decode_add(words.data(), a2.data(), n);
    ASSERT_TRUE(same_bits(a1, a2)) << n;
  }
}

// A pull reply lands in the output array and is decoded where it is: the
// result equals decoding from a separate buffer, for every codec and for
// sizes around the in-place block (4096 values).
TEST(DecodeInPlace, EqualsDecodingFromASeparateBuffer) {
  for (const char* type : {"2bit", "1bit", "fp16"})
    for (size_t n : {size_t{5}, size_t{17}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{12289},
                     size_t{100000}}) {
      std::map<std::string, std::string> p{{"type", type}};
      Compressor c(parse_settings(p));
      const auto g = gradients(n, 0.5f, static_cast<uint32_t>(n));
      std::vector<std::byte> wire(c.encoded_bytes(n));
      c.encode(1, 0, n, 0, g.data(), n, wire.data());
      std::vector<float> want(n, 0.0f);
      ASSERT_TRUE(decode_add(wire, want.data(), n).is_ok());
      std::vector<float> buf(n, 3.0f);
      std::memcpy(buf.data(), wire.data(), wire.size());
      Status st = decode_in_place(reinterpret_cast<std::byte*>(buf.data()), wire.size(), n);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      ASSERT_TRUE(same_bits(want, buf)) << type << " n " << n;
    }
}

TEST(DecodeInPlace, RefusesMalformedRepliesAndLeavesTheBytes) {
  const size_t n = 1000;
  Compressor c(parse_settings({{"type", "2bit"}}));
  std::vector<float> g(n, 1.0f);
  std::vector<std::byte> wire(c.encoded_bytes(n));
  c.encode(1, 0, n, 0, g.data(), n, wire.data());
  auto attempt = [&](std::vector<std::byte> w, size_t len) {
    std::vector<float> buf(n, 0.0f);
    std::memcpy(buf.data(), w.data(), std::min(w.size(), 4 * n));
    std::vector<float> before = buf;
    Status st = decode_in_place(reinterpret_cast<std::byte*>(buf.data()), len, n);
    if (st.is_ok()) {
      EXPECT_EQ(buf[999], 0.5f) << "1.0 pushed once: +t";
    } else {
      EXPECT_TRUE(same_bits(before, buf)) << "bytes changed on error";
    }
    return st;
  };
  EXPECT_EQ(attempt(wire, wire.size() - 1).code(), ErrorCode::kProtocolError);  // short
  EXPECT_EQ(attempt(wire, 4).code(), ErrorCode::kProtocolError);                // no header
  EXPECT_EQ(attempt(wire, 4 * n + 1).code(), ErrorCode::kProtocolError);        // too big
  auto bad = wire;
  bad[0] = std::byte{9};  // unknown type
  EXPECT_EQ(attempt(bad, bad.size()).code(), ErrorCode::kProtocolError);
  bad = wire;
  const float negative = -1.0f;  // a 2bit threshold must be positive
  std::memcpy(bad.data() + 4, &negative, 4);
  EXPECT_EQ(attempt(bad, bad.size()).code(), ErrorCode::kProtocolError);
  EXPECT_TRUE(attempt(wire, wire.size()).is_ok());
}

}  // namespace
}  // namespace pushpull::compress
