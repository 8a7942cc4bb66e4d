// SPDX-License-Identifier: Apache-2.0
// The gradient codecs (2bit, 1bit, fp16): bit layouts, round trips, residual
// carry, thresholds, odd sizes, 16-bit inputs, and the wire form's checks.
#include "compress/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "compress/compressor.h"
#include "compress/fp16.h"
#include "compress/one_bit.h"
#include "compress/two_bit.h"
#include "pushpull/dtype.h"
#include "pushpull/error.h"
#include "pushpull/kernels.h"

namespace pushpull::compress {
namespace {

std::vector<std::byte> buffer(const Codec& c, size_t n) {
  return std::vector<std::byte>(c.compressed_bytes(n), std::byte{0xAB});
}
uint32_t word_at(const std::vector<std::byte>& b, size_t w) {
  uint32_t v;
  std::memcpy(&v, b.data() + 4 * w, 4);
  return v;
}

// The reference quantisers, element by element, as docs/kvstore.md states them.
float ref_2bit(float& r, float g, float t) {
  r += g;
  if (r >= t) {
    r -= t;
    return t;
  }
  if (r <= -t) {
    r += t;
    return -t;
  }
  return 0.0f;
}
float ref_1bit(float& r, float g, float t) {
  r += g;
  if (r > t) {
    r -= 1;
    return 1;
  }
  r += 1;
  return -1;
}

TEST(TwoBit, PacksSixteenValuesPerWord) {
  EXPECT_EQ(TwoBitCodec::bytes_for(0), 0u);
  EXPECT_EQ(TwoBitCodec::bytes_for(1), 4u);
  EXPECT_EQ(TwoBitCodec::bytes_for(16), 4u);
  EXPECT_EQ(TwoBitCodec::bytes_for(17), 8u);
  TwoBitCodec c(0.5f);
  std::vector<float> g = {0.6f, -0.7f, 0.1f, 0.5f, -0.5f};
  std::vector<float> r(g.size(), 0.0f);
  auto out = buffer(c, g.size());
  c.compress(g.data(), r.data(), out.data(), g.size());
  // codes: +t, -t, 0, +t, -t → 01 10 00 01 10 (value 0 in the low bits); unused bits 0
  EXPECT_EQ(word_at(out, 0), 0b10'01'00'10'01u);
  EXPECT_FLOAT_EQ(r[0], 0.1f);
  EXPECT_FLOAT_EQ(r[1], -0.2f);
  EXPECT_FLOAT_EQ(r[2], 0.1f);
  EXPECT_FLOAT_EQ(r[3], 0.0f);
  std::vector<float> dec(g.size());
  c.decompress(out.data(), dec.data(), dec.size());
  EXPECT_EQ(dec, (std::vector<float>{0.5f, -0.5f, 0.0f, 0.5f, -0.5f}));
}

TEST(TwoBit, BelowThresholdAccumulatesUntilItCrosses) {
  TwoBitCodec c(1.0f);
  std::vector<float> g(20, 0.3f), r(20, 0.0f), acc(20, 0.0f);
  auto out = buffer(c, 20);
  for (int step = 1; step <= 3; ++step) {
    c.compress(g.data(), r.data(), out.data(), g.size());
    c.decompress_add(out.data(), acc.data(), acc.size());
    EXPECT_EQ(acc[19], 0.0f) << "step " << step;  // 0.3, 0.6, 0.9 stay below t
  }
  c.compress(g.data(), r.data(), out.data(), g.size());  // 1.2 crosses
  c.decompress_add(out.data(), acc.data(), acc.size());
  EXPECT_EQ(acc[0], 1.0f);
  EXPECT_NEAR(r[0], 0.2f, 1e-6);
}

TEST(TwoBit, RejectsBadThreshold) {
  EXPECT_THROW(TwoBitCodec{0.0f}, InvalidArgument);
  EXPECT_THROW(TwoBitCodec{-1.0f}, InvalidArgument);
  EXPECT_THROW(TwoBitCodec{std::nanf("")}, InvalidArgument);
  EXPECT_THROW(TwoBitCodec{INFINITY}, InvalidArgument);
}

TEST(OneBit, PacksThirtyTwoValuesPerWordAsSigns) {
  EXPECT_EQ(OneBitCodec::bytes_for(0), 0u);
  EXPECT_EQ(OneBitCodec::bytes_for(32), 4u);
  EXPECT_EQ(OneBitCodec::bytes_for(33), 8u);
  OneBitCodec c(0.0f);
  std::vector<float> g = {0.3f, -0.2f, 0.0f, 2.0f};
  std::vector<float> r(g.size(), 0.0f);
  auto out = buffer(c, g.size());
  c.compress(g.data(), r.data(), out.data(), g.size());
  EXPECT_EQ(word_at(out, 0), 0b1001u);  // +1, -1, -1 (0 is not above 0), +1
  EXPECT_FLOAT_EQ(r[0], -0.7f);
  EXPECT_FLOAT_EQ(r[1], 0.8f);
  EXPECT_FLOAT_EQ(r[2], 1.0f);
  EXPECT_FLOAT_EQ(r[3], 1.0f);
  std::vector<float> dec(g.size());
  c.decompress(out.data(), dec.data(), dec.size());
  EXPECT_EQ(dec, (std::vector<float>{1, -1, -1, 1}));
}

TEST(OneBit, ThresholdMovesTheSplitAndResidualCarries) {
  OneBitCodec c(0.5f);
  std::vector<float> g(3, 0.4f), r(3, 0.0f), dec(3);
  auto out = buffer(c, 3);
  // 0.4 <= 0.5: -1, r = 1.4; then 1.8 > 0.5: +1, r = 0.8; then 1.2: +1, r = 0.2
  const float expect[3] = {-1, 1, 1};
  const float expect_r[3] = {1.4f, 0.8f, 0.2f};
  for (int step = 0; step < 3; ++step) {
    c.compress(g.data(), r.data(), out.data(), 3);
    c.decompress(out.data(), dec.data(), 3);
    EXPECT_EQ(dec[2], expect[step]) << step;
    EXPECT_NEAR(r[2], expect_r[step], 1e-6) << step;
  }
  EXPECT_NO_THROW(OneBitCodec{-2.0f});  // any finite split
  EXPECT_THROW(OneBitCodec{INFINITY}, InvalidArgument);
}

TEST(Fp16, RoundTripsHalfValuesExactlyAndCarriesRounding) {
  Fp16Codec c;
  EXPECT_EQ(c.compressed_bytes(3), 6u);
  std::vector<float> g = {1.0f, -2.5f, 65504.0f}, r(3, 0.0f), dec(3);
  auto out = buffer(c, 3);
  c.compress(g.data(), r.data(), out.data(), 3);
  c.decompress(out.data(), dec.data(), 3);
  EXPECT_EQ(dec, g);  // representable: exact
  EXPECT_EQ(r, std::vector<float>(3, 0.0f));
  // 1 + 2^-12 is not a half: sent as 1, the 2^-12 waits in the residual and
  // goes out once enough has accumulated.
  const float tiny = std::ldexp(1.0f, -12);
  std::vector<float> g2(1, 1.0f + tiny), r2(1, 0.0f), acc(1, 0.0f);
  std::vector<std::byte> o2(2);
  double sent = 0;
  for (int step = 0; step < 8; ++step) {
    c.compress(g2.data(), r2.data(), o2.data(), 1);
    acc[0] = 0;
    c.decompress_add(o2.data(), acc.data(), 1);
    sent += acc[0];
  }
  EXPECT_NEAR(sent + r2[0], 8 * (1.0 + tiny), 1e-6);  // nothing lost
  EXPECT_GT(sent, 8.0);                               // and some of it already sent
}

TEST(Fp16, OutOfRangeStaysInTheResidual) {
  Fp16Codec c;
  std::vector<float> g = {1.0e6f, -1.0e6f}, r(2, 0.0f), dec(2);
  std::vector<std::byte> out(4);
  c.compress(g.data(), r.data(), out.data(), 2);
  c.decompress(out.data(), dec.data(), 2);
  EXPECT_EQ(dec[0], 65504.0f);
  EXPECT_EQ(dec[1], -65504.0f);
  EXPECT_FLOAT_EQ(r[0], 1.0e6f - 65504.0f);
  EXPECT_TRUE(std::isfinite(r[1]));
}

// Every codec against its reference on random gradients, at sizes around the
// word boundaries, over several steps (the residual carries between them).
class CodecVsReference : public ::testing::TestWithParam<Settings> {};

TEST_P(CodecVsReference, RandomGradientsAtOddSizes) {
  const Settings s = GetParam();
  auto c = make_codec(s);
  ASSERT_TRUE(c);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (size_t n : {1, 15, 16, 17, 31, 32, 33, 1001}) {
    std::vector<float> r(n, 0.0f), ref_r(n, 0.0f), dec(n);
    // Bytes past the encoded ones must stay untouched (odd sizes never spill).
    std::vector<std::byte> out(c->compressed_bytes(n) + 4, std::byte{0x5A});
    for (int step = 0; step < 5; ++step) {
      std::vector<float> g(n);
      for (auto& v : g)
        v = dist(rng);
      c->compress(g.data(), r.data(), out.data(), n);
      c->decompress(out.data(), dec.data(), n);
      for (size_t i = 0; i < n; ++i) {
        float q;
        if (s.type == Type::k2Bit) {
          q = ref_2bit(ref_r[i], g[i], s.threshold);
        } else if (s.type == Type::k1Bit) {
          q = ref_1bit(ref_r[i], g[i], s.threshold);
        } else {
          ref_r[i] += g[i];
          q = half_to_float(float_to_half(ref_r[i]));
          ref_r[i] -= q;
        }
        ASSERT_EQ(dec[i], q) << "n " << n << " step " << step << " i " << i;
        ASSERT_FLOAT_EQ(r[i], ref_r[i]) << "n " << n << " i " << i;
      }
      for (size_t b = c->compressed_bytes(n); b < out.size(); ++b)
        ASSERT_EQ(out[b], std::byte{0x5A});
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, CodecVsReference,
                         ::testing::Values(Settings{Type::k2Bit, 0.7f}, Settings{Type::k1Bit, 0.0f},
                                           Settings{Type::k1Bit, 0.5f},
                                           Settings{Type::kFp16, 0.5f}),
                         [](const auto& info) {
                           return std::string(type_name(info.param.type)) + "_" +
                                  std::to_string(info.index);
                         });

// A store sums 16-bit pushes in float32 before compressing: float16 and
// bfloat16 inputs take the same path as float32 ones with those values.
TEST(Codecs, SixteenBitInputsCompressTheirFloat32Values) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> in(40);
    std::vector<float> as32(40);
    for (size_t i = 0; i < in.size(); ++i)
      as32[i] = static_cast<float>(i) * 0.125f - 2.0f;  // exact in both 16-bit types
    convert(dt, in.data(), DType::kFloat32, as32.data(), in.size());
    std::vector<float> back(40);
    convert(DType::kFloat32, back.data(), dt, in.data(), in.size());
    ASSERT_EQ(back, as32) << dtype_name(dt);
    for (Type t : {Type::k2Bit, Type::k1Bit, Type::kFp16}) {
      auto c = make_codec(Settings{t, 0.5f});
      std::vector<float> r(40, 0.0f), dec(40);
      std::vector<std::byte> out(c->compressed_bytes(40));
      c->compress(back.data(), r.data(), out.data(), 40);
      c->decompress(out.data(), dec.data(), 40);
      for (size_t i = 0; i < 40; ++i)
        ASSERT_FLOAT_EQ(dec[i] + r[i], as32[i]) << dtype_name(dt) << " " << type_name(t);
    }
  }
}

// ---- Settings: one parser, one error per mistake ----

TEST(Settings, ParsesEveryTypeWithDefaults) {
  EXPECT_EQ(parse_settings({}), Settings{});
  EXPECT_FALSE(parse_settings({{"type", "none"}}).enabled());
  EXPECT_EQ(parse_settings({{"type", "2bit"}}), (Settings{Type::k2Bit, 0.5f}));
  EXPECT_EQ(parse_settings({{"type", "2bit"}, {"threshold", "0.25"}}),
            (Settings{Type::k2Bit, 0.25f}));
  EXPECT_EQ(parse_settings({{"type", "1bit"}, {"threshold", "0"}}), (Settings{Type::k1Bit, 0.0f}));
  EXPECT_EQ(parse_settings({{"type", "1bit"}, {"threshold", "-0.5"}}).threshold, -0.5f);
  EXPECT_EQ(parse_settings({{"type", "fp16"}}).type, Type::kFp16);
  EXPECT_EQ(parse_settings({{"type", "2bit"}}).to_string(), "2bit(threshold=0.5)");
  EXPECT_EQ(parse_settings({{"type", "fp16"}}).to_string(), "fp16");
}

void expect_error(const std::map<std::string, std::string>& p, const std::string& text) {
  try {
    parse_settings(p);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(Settings, BadSettingsNameTheMistake) {
  expect_error({{"type", "3bit"}},
               "gradient compression type '3bit' is unknown; valid: none, 2bit");
  expect_error({{"type", "2BIT"}}, "'2BIT' is unknown");
  expect_error({{"ratio", "1"}}, "parameter 'ratio' is unknown; valid: type, threshold");
  expect_error({{"type", "2bit"}, {"threshold", "abc"}}, "threshold 'abc' is not a finite number");
  expect_error({{"type", "2bit"}, {"threshold", "0.5x"}}, "'0.5x' is not a finite number");
  expect_error({{"type", "2bit"}, {"threshold", ""}}, "'' is not a finite number");
  expect_error({{"type", "2bit"}, {"threshold", "nan"}}, "'nan' is not a finite number");
  expect_error({{"type", "1bit"}, {"threshold", "inf"}}, "'inf' is not a finite number");
  expect_error({{"type", "2bit"}, {"threshold", "1e39"}}, "not a finite number");
  expect_error({{"type", "2bit"}, {"threshold", "0"}},
               "2bit compression threshold must be positive");
  expect_error({{"type", "2bit"}, {"threshold", "-1"}}, "must be positive, got -1");
  expect_error({{"type", "fp16"}, {"threshold", "0.5"}}, "type 'fp16' takes no threshold");
  expect_error({{"threshold", "0.5"}}, "type 'none' takes no threshold");
}

// ---- The wire form ----

TEST(Compressor, EncodesRangesAgainstOneResidualPerKeyAndDevice) {
  Compressor c(Settings{Type::k2Bit, 0.5f});
  EXPECT_EQ(c.encoded_bytes(17), kHeaderBytes + 8);
  std::vector<float> g(20, 0.3f);
  std::vector<std::byte> a(c.encoded_bytes(12)), b(c.encoded_bytes(8));
  // Two parts of one key (a server slice each), device 0.
  c.encode(7, 0, 20, 0, g.data(), 12, a.data());
  c.encode(7, 0, 20, 12, g.data() + 12, 8, b.data());
  EXPECT_EQ(c.residual(7, 0), std::vector<float>(20, 0.3f));
  EXPECT_TRUE(c.residual(7, 1).empty());  // another device has its own
  c.encode(7, 1, 20, 0, g.data(), 12, a.data());
  EXPECT_EQ(c.residual(7, 1)[11], 0.3f);
  EXPECT_EQ(c.residual(7, 1)[12], 0.0f);
  // Second push: 0.6 crosses; decode_add gives +0.5.
  c.encode(7, 0, 20, 0, g.data(), 12, a.data());
  std::vector<float> acc(12, 1.0f);
  ASSERT_TRUE(decode_add(a, acc.data(), 12).is_ok());
  EXPECT_EQ(acc[0], 1.5f);
  EXPECT_THROW(c.encode(7, 0, 21, 0, g.data(), 12, a.data()), InvalidArgument);   // size changed
  EXPECT_THROW(c.encode(7, 0, 20, 15, g.data(), 12, a.data()), InvalidArgument);  // outside
  EXPECT_THROW(Compressor(Settings{}), InvalidArgument);
}

TEST(Compressor, DecodeRefusesMalformedPartsAndLeavesTheSumAlone) {
  Compressor c(Settings{Type::k1Bit, 0.0f});
  std::vector<float> g(40, 1.0f);
  std::vector<std::byte> good(c.encoded_bytes(40));
  c.encode(1, 0, 40, 0, g.data(), 40, good.data());
  std::vector<float> acc(40, 0.0f);
  ASSERT_TRUE(decode_add(good, acc.data(), 40).is_ok());
  EXPECT_EQ(acc[39], 1.0f);
  auto refused = [&](std::vector<std::byte> bytes, size_t n, const std::string& text) {
    std::vector<float> a(n, 7.0f);
    Status s = decode_add(bytes, a.data(), n);
    EXPECT_EQ(s.code(), ErrorCode::kProtocolError) << text;
    EXPECT_NE(s.to_string().find(text), std::string::npos) << s.to_string();
    EXPECT_EQ(a, std::vector<float>(n, 7.0f));
  };
  refused({}, 40, "no header");
  refused(std::vector<std::byte>(good.begin(), good.end() - 1), 40, "expected 16");
  refused(good, 65, "expected");  // 65 values take 3 words, not 2
  auto bad = good;
  bad[0] = std::byte{9};
  refused(bad, 40, "unknown compression type 9");
  bad = good;
  bad[0] = std::byte{0};
  refused(bad, 40, "unknown compression type 0");
  bad = good;
  bad[1] = std::byte{2};
  refused(bad, 40, "version 2");
  bad = good;
  bad[0] = std::byte{1};  // 2bit with threshold 0
  float zero = 0;
  std::memcpy(bad.data() + 4, &zero, 4);
  bad.resize(kHeaderBytes + TwoBitCodec::bytes_for(40));
  refused(bad, 40, "must be positive");
}

}  // namespace
}  // namespace pushpull::compress
