// SPDX-License-Identifier: Apache-2.0
// Framing: header encoding is explicit little-endian and validated.
#include <gtest/gtest.h>

#include <array>
#include <limits>
#include <random>
#include <vector>

#include "transport/address.h"
#include "transport/buffer_pool.h"
#include "transport/hello.h"
#include "transport/message.h"
#include "transport/wire.h"

namespace pushpull::transport {
namespace {

Header sample() {
  Header h;
  h.type = 77;
  h.flags = 0xa1b2c3d4;
  h.sender = 0x01020304;
  h.request_id = 0x1122334455667788ull;
  h.key = 42;
  h.dtype = 3;
  h.offset = 1ull << 40;
  h.length = 5ull << 33;
  h.payload_bytes = 4096;
  return h;
}

TEST(Header, RoundTripAndLittleEndianLayout) {
  Header h = sample();
  HeaderBytes b = encode_header(h);
  EXPECT_EQ(static_cast<uint8_t>(b[0]), 'P');
  EXPECT_EQ(static_cast<uint8_t>(b[3]), 'H');
  EXPECT_EQ(static_cast<uint8_t>(b[6]), 77);     // type, low byte first
  EXPECT_EQ(static_cast<uint8_t>(b[12]), 0x04);  // sender little-endian
  EXPECT_EQ(static_cast<uint8_t>(b[16]), 0x88);
  EXPECT_EQ(static_cast<uint8_t>(b[56]), 0x00);
  EXPECT_EQ(static_cast<uint8_t>(b[57]), 0x10);  // 4096 = 0x1000
  Header out;
  ASSERT_TRUE(decode_header(b, 1 << 20, &out).is_ok());
  EXPECT_EQ(out, h);
}

TEST(Header, RejectsBadMagicVersionReservedAndOversize) {
  Header out;
  HeaderBytes b = encode_header(sample());
  b[0] = std::byte{'X'};
  Status s = decode_header(b, 1 << 20, &out);
  EXPECT_EQ(s.code(), ErrorCode::kProtocolError);
  EXPECT_NE(s.message().find("magic"), std::string::npos);

  Header v = sample();
  v.version = 9;
  s = decode_header(encode_header(v), 1 << 20, &out);
  EXPECT_NE(s.message().find("version 9"), std::string::npos);

  b = encode_header(sample());
  b[37] = std::byte{1};
  EXPECT_FALSE(decode_header(b, 1 << 20, &out).is_ok());

  s = decode_header(encode_header(sample()), 4095, &out);
  EXPECT_EQ(s.code(), ErrorCode::kProtocolError);
  EXPECT_NE(s.message().find("4096"), std::string::npos);
  EXPECT_TRUE(decode_header(encode_header(sample()), 4096, &out).is_ok());
}

TEST(Header, RandomBytesNeverCrashAndRarelyDecode) {
  std::mt19937_64 rng(7);
  int ok = 0;
  for (int i = 0; i < 10000; ++i) {
    HeaderBytes b;
    for (auto& x : b)
      x = static_cast<std::byte>(rng());
    Header h;
    ok += decode_header(b, 1 << 20, &h).is_ok();
  }
  EXPECT_EQ(ok, 0);
}

TEST(Hello, ProofDependsOnSecretNoncesDirectionAndIdentity) {
  Nonce a = random_nonce(), n = random_nonce();
  ProofInput in{Direction::kConnector, a, n, "job", Role::kWorker, 1};
  Proof p = compute_proof("s3cret", in);
  EXPECT_TRUE(proof_equal(p, compute_proof("s3cret", in)));
  EXPECT_FALSE(proof_equal(p, compute_proof("other", in)));
  auto changed = [&](auto edit) {
    ProofInput other = in;
    edit(other);
    return !proof_equal(p, compute_proof("s3cret", other));
  };
  EXPECT_TRUE(changed([](ProofInput& i) { i.acceptor_nonce = random_nonce(); }));
  EXPECT_TRUE(changed([](ProofInput& i) { i.connector_nonce = random_nonce(); }));
  EXPECT_TRUE(changed([](ProofInput& i) { i.direction = Direction::kAcceptor; }));
  EXPECT_TRUE(changed([](ProofInput& i) { i.job_id = "job2"; }));
  EXPECT_TRUE(changed([](ProofInput& i) { i.role = Role::kServer; }));
  EXPECT_TRUE(changed([](ProofInput& i) { i.rank = 2; }));

  Hello h{kProtocolVersion, job_tag("job"), Role::kWorker, 1, "127.0.0.1", 5, n, p};
  auto refusal = [&](const Nonce& nonce, uint16_t version, const std::string& job,
                     const std::string& secret) {
    Status st = check_hello(h, nonce, version, job, secret);
    EXPECT_EQ(st.is_ok() ? ErrorCode::kProtocolError : st.code(), ErrorCode::kProtocolError);
    return st.message();  // "" when accepted
  };
  EXPECT_TRUE(check_hello(h, a, kProtocolVersion, "job", "s3cret").is_ok());
  EXPECT_NE(refusal(a, kProtocolVersion, "job", "wrong").find("secret"), std::string::npos);
  EXPECT_NE(refusal(random_nonce(), kProtocolVersion, "job", "s3cret").find("secret"),
            std::string::npos);
  EXPECT_NE(refusal(a, kProtocolVersion, "other", "s3cret").find("job id"), std::string::npos);
  EXPECT_NE(refusal(a, kProtocolVersion + 1, "job", "s3cret").find("version"), std::string::npos);
  EXPECT_TRUE(check_hello(h, a, kProtocolVersion, "job", "").is_ok());

  Hello back;
  auto bytes = encode(h);
  ASSERT_TRUE(decode(bytes, &back).is_ok());
  EXPECT_EQ(back.host, "127.0.0.1");
  EXPECT_EQ(back.rank, 1);
  EXPECT_TRUE(proof_equal(back.proof, p));
  bytes.pop_back();
  EXPECT_FALSE(decode(bytes, &back).is_ok());
}

TEST(Address, FollowsPsLiteOrder) {
  std::vector<InterfaceAddress> ifs = {
      {"lo", "127.0.0.1", false, true, true},   {"eth0", "fd00::5", true, false, true},
      {"eth0", "10.0.0.5", false, false, true}, {"ib0", "192.168.7.1", false, false, true},
      {"v6only", "fd00::9", true, false, true},
  };
  NetOptions o;
  EXPECT_EQ(choose_host(o, ifs), "10.0.0.5");
  o.interface = "ib0";
  EXPECT_EQ(choose_host(o, ifs), "192.168.7.1");
  o.interface = "v6only";
  EXPECT_EQ(choose_host(o, ifs), "fd00::9");
  o.interface = "nope";
  EXPECT_THROW(choose_host(o, ifs), InvalidArgument);
  o.node_host = "1.2.3.4";
  EXPECT_EQ(choose_host(o, ifs), "1.2.3.4");
  NetOptions d;
  EXPECT_EQ(choose_host(d, {{"lo", "127.0.0.1", false, true, true}}), "127.0.0.1");
  EXPECT_FALSE(choose_host(d).empty());
}

TEST(BufferPool, ReusesBuffersBySizeClass) {
  BufferPool pool(4);
  std::byte* first;
  {
    Buffer b = pool.acquire(1000);
    EXPECT_EQ(b.size(), 1000u);
    EXPECT_EQ(b.capacity(), 1024u);
    first = b.data();
  }
  EXPECT_EQ(pool.cached(), 1u);
  Buffer c = pool.acquire(900);
  EXPECT_EQ(c.data(), first);
  EXPECT_EQ(pool.cached(), 0u);
  Buffer e = pool.acquire(0);
  EXPECT_TRUE(e.empty());
}

// ---- transport/wire.h: the one codec ----------------------------------------------

std::vector<std::byte> bytes_of(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int x : v)
    out.push_back(static_cast<std::byte>(x));
  return out;
}

TEST(Wire, IntegersAreLittleEndianAndRoundTrip) {
  Writer w;
  w.u<uint16_t>(0x0102).u<int32_t>(-2).u<uint64_t>(0x1122334455667788ull).f32(1.5f);
  auto b = w.take();
  ASSERT_EQ(b.size(), 2u + 4 + 8 + 4);
  EXPECT_EQ(static_cast<int>(b[0]), 0x02);
  EXPECT_EQ(static_cast<int>(b[2]), 0xfe);  // -2
  EXPECT_EQ(static_cast<int>(b[6]), 0x88);
  Reader r(b);
  EXPECT_EQ(r.u<uint16_t>(), 0x0102);
  EXPECT_EQ(r.u<int32_t>(), -2);
  EXPECT_EQ(r.u<uint64_t>(), 0x1122334455667788ull);
  EXPECT_EQ(r.f32(), 1.5f);
  EXPECT_TRUE(r.done());
}

TEST(Wire, ShortInputFailsInsteadOfReadingPast) {
  auto b = bytes_of({1, 2, 3});
  Reader r(b);
  EXPECT_EQ(r.u<uint32_t>(), 0u);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.u<uint8_t>(), 0);  // stays failed, reads nothing
  EXPECT_EQ(r.pos(), 0u);
  EXPECT_FALSE(r.done());
}

TEST(Wire, StringsCheckTheirLengthAgainstMaxAndInput) {
  Writer w;
  w.str("hello").str<uint16_t>("key");
  auto b = w.take();
  Reader r(b);
  EXPECT_EQ(r.str(), "hello");
  EXPECT_EQ(r.str<uint16_t>(), "key");
  EXPECT_TRUE(r.done());

  Reader too_long(b);
  EXPECT_EQ(too_long.str(4), "");
  EXPECT_FALSE(too_long.ok());

  auto lying = bytes_of({0xff, 0xff, 0xff, 0x7f, 'a'});  // 2 GiB announced, 1 byte there
  Reader r2(lying);
  EXPECT_EQ(r2.str(std::numeric_limits<uint32_t>::max()), "");
  EXPECT_FALSE(r2.ok());
}

TEST(Wire, CountRejectsWhatTheInputCannotHold) {
  // Three 8-byte items announced, two there.
  Writer w;
  w.u<uint32_t>(3).u<uint64_t>(1).u<uint64_t>(2);
  auto b = w.take();
  Reader short_input(b);
  EXPECT_EQ(short_input.count(100, 8), 0u);
  EXPECT_FALSE(short_input.ok());

  Reader over_max(b);
  EXPECT_EQ(over_max.count(2, 1), 0u);
  EXPECT_FALSE(over_max.ok());

  Reader fine(b);
  EXPECT_EQ(fine.count(100, 4), 3u);  // 4-byte minimum: 12 bytes needed, 16 there
  EXPECT_TRUE(fine.ok());

  auto huge = bytes_of({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff});
  Reader r64(huge);
  EXPECT_EQ(r64.count<uint64_t>(std::numeric_limits<size_t>::max(), 1), 0u);
  EXPECT_FALSE(r64.ok());
}

TEST(Wire, ViewRestAndDone) {
  auto b = bytes_of({1, 2, 3, 4, 5});
  Reader r(b);
  auto v = r.view(2);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(static_cast<int>(v[1]), 2);
  EXPECT_FALSE(r.done());  // trailing bytes are malformed
  Reader r2(b);
  r2.view(1);
  auto rest = r2.rest();
  EXPECT_EQ(rest.size(), 4u);
  EXPECT_TRUE(r2.done());
  Reader r3(b);
  EXPECT_TRUE(r3.view(6).empty());
  EXPECT_FALSE(r3.ok());
  EXPECT_TRUE(r3.rest().empty());
}

TEST(Wire, SpanWriterStopsAtTheEnd) {
  std::array<std::byte, 6> buf{};
  SpanWriter w(buf);
  w.u<uint32_t>(0xaabbccdd);
  EXPECT_TRUE(w.ok());
  EXPECT_FALSE(w.full());
  w.u<uint32_t>(1);  // 4 more bytes do not fit: nothing written
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(w.pos(), 4u);
  EXPECT_EQ(static_cast<int>(buf[4]), 0);
  EXPECT_EQ(static_cast<int>(buf[0]), 0xdd);
}

TEST(Wire, RandomInputNeverReadsPastTheEnd) {
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> b(rng() % 24);
    for (auto& x : b)
      x = static_cast<std::byte>(rng());
    Reader r(b);
    (void)r.u<uint16_t>();
    (void)r.str(64);
    size_t n = r.count(1000, 8);
    for (size_t k = 0; k < n; ++k)
      (void)r.u<uint64_t>();
    (void)r.view(rng() % 8);
    EXPECT_LE(r.pos(), b.size());
    (void)r.done();
  }
}

}  // namespace
}  // namespace pushpull::transport
