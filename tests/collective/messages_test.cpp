// SPDX-License-Identifier: Apache-2.0
// The engine's control messages (collective/messages.h) on transport/wire.h: round
// trips, and truncated, garbage, huge-count or overflowing-shape input is a
// ProtocolError (never a read past the input: run under ASan to check that).
#include "collective/messages.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "transport/wire.h"

namespace pushpull::collective {
namespace {

std::span<const std::byte> as_span(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

Spec sample_spec() {
  Spec s;
  s.name = "grad.0";
  s.type = OpType::kAllreduce;
  s.dtype = DType::kFloat16;
  s.shape = Shape{3, 4};
  s.postscale = 0.125;
  return s;
}

TEST(CollectiveMessages, RoundTrip) {
  Announce a;
  a.specs = {sample_spec()};
  a.cached = {7, 9};
  a.join = true;
  Announce got;
  ASSERT_TRUE(decode_announce(as_span(encode(a)), 4, &got).is_ok());
  ASSERT_EQ(got.specs.size(), 1u);
  EXPECT_EQ(got.specs[0], a.specs[0]);
  EXPECT_EQ(got.cached, a.cached);
  EXPECT_TRUE(got.join);

  Response r;
  r.tensors = {ResponseTensor{"grad.0", 3, true, sample_spec()}};
  r.joined = {1};
  r.rows = {2, 5};
  std::vector<Response> rs;
  ASSERT_TRUE(decode_responses(as_span(encode({r})), 4, &rs).is_ok());
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].tensors[0].spec, sample_spec());
  EXPECT_EQ(rs[0].rows, r.rows);
  EXPECT_EQ(decode_responses(encode({r}), 4).size(), 1u);
}

TEST(CollectiveMessages, EveryPrefixAndRandomBytesAreRejectedCleanly) {
  Announce a;
  a.specs = {sample_spec(), sample_spec()};
  a.cached = {1};
  Response r;
  r.tensors = {ResponseTensor{"x", 0, true, sample_spec()}};
  r.joined = {0, 1};
  r.kind = Response::Kind::kError;
  r.code = ErrorCode::kTimeout;
  r.message = "late";
  for (const std::string& good : {encode(a), encode({r})}) {
    for (size_t n = 0; n < good.size(); ++n) {
      auto prefix = as_span(good).first(n);
      Announce an;
      std::vector<Response> rs;
      Status s1 = decode_announce(prefix, 4, &an), s2 = decode_responses(prefix, 4, &rs);
      if (!s1.is_ok()) {
        EXPECT_EQ(s1.code(), ErrorCode::kProtocolError);
      }
      if (!s2.is_ok()) {
        EXPECT_EQ(s2.code(), ErrorCode::kProtocolError);
      }
    }
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> b(rng() % 80);
    for (auto& x : b)
      x = static_cast<std::byte>(rng() % 4 == 0 ? rng() : rng() % 3);  // many small counts
    Announce an;
    std::vector<Response> rs;
    (void)decode_announce(b, 4, &an);
    (void)decode_responses(b, 4, &rs);
  }
}

TEST(CollectiveMessages, HugeCountsAndOverflowingShapesAreRejected) {
  transport::Writer w;
  w.u<uint32_t>(1u << 20);  // a million specs announced, none follow
  Announce an;
  EXPECT_EQ(decode_announce(w.data(), 4, &an).code(), ErrorCode::kProtocolError);

  transport::Writer s;
  s.u<uint32_t>(1);
  s.str("big").u<uint8_t>(0).u<uint8_t>(static_cast<uint8_t>(DType::kFloat64)).u<uint8_t>(0);
  s.u<int32_t>(0).u<uint8_t>(2);
  s.u<int64_t>(int64_t{1} << 40).u<int64_t>(int64_t{1} << 40);  // 2^80 elements
  s.u<uint32_t>(0).u<uint8_t>(0);
  Status st = decode_announce(s.data(), 4, &an);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("shape"), std::string::npos) << st.message();
  std::string str(reinterpret_cast<const char*>(s.data().data()), s.data().size());
  EXPECT_THROW(decode_announce(str, 4), ProtocolError);
}

TEST(CollectiveMessages, APostscaleIsPartOfTheSignatureAndMustBeFinite) {
  Spec a = sample_spec(), b = sample_spec();
  b.postscale = 0.25;
  EXPECT_FALSE(a == b);
  EXPECT_FALSE(a.compatible(b));  // a mismatch between ranks
  EXPECT_NE(b.describe().find("postscale 0.25"), std::string::npos) << b.describe();
  for (double bad :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    Announce an;
    an.specs = {sample_spec()};
    an.specs[0].postscale = bad;
    Announce got;
    Status st = decode_announce(as_span(encode(an)), 4, &got);
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
    EXPECT_NE(st.message().find("postscale"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace pushpull::collective
