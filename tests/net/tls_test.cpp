// SPDX-License-Identifier: Apache-2.0
// TlsLink (transport/tls.h) over socket pairs: the handshake keyed from the job
// secret, both directions at once from two threads, refusals (another
// secret, a plain peer), and what an observer of the wire sees.
#include "transport/tls.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "pushpull/error.h"
#include "transport/socket.h"

namespace pushpull::transport {
namespace {

using Clock = std::chrono::steady_clock;

std::pair<Fd, Fd> socket_pair() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  return {Fd(sv[0]), Fd(sv[1])};
}

std::shared_ptr<const TlsContext> context(const std::string& secret) {
  NetOptions n;
  n.tls = true;
  n.job_id = "tls-test";
  n.job_secret = secret;
  return tls_context(n);
}

// Drives both handshakes on this thread until both end.
std::pair<TlsLink::Step, TlsLink::Step> handshake_both(TlsLink& a, TlsLink& b) {
  auto deadline = Clock::now() + std::chrono::seconds(10);
  TlsLink::Step sa = TlsLink::Step::kWaiting, sb = TlsLink::Step::kWaiting;
  while (Clock::now() < deadline &&
         (sa == TlsLink::Step::kWaiting || sb == TlsLink::Step::kWaiting)) {
    if (sa == TlsLink::Step::kWaiting) sa = a.handshake();
    if (sb == TlsLink::Step::kWaiting) sb = b.handshake();
  }
  a.flush();
  b.flush();
  return {sa, sb};
}

std::vector<unsigned char> random_bytes(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  std::mt19937 rng(seed);
  for (auto& x : v)
    x = static_cast<unsigned char>(rng());
  return v;
}

TEST(Tls, TwoLinksWithOneSecretMoveBytesBothWaysAtOnce) {
  auto [x, y] = socket_pair();
  auto ctx = context("s3cret");
  TlsLink client(ctx, x.get(), TlsLink::Side::kClient);
  TlsLink server(ctx, y.get(), TlsLink::Side::kServer);
  auto [sc, ss] = handshake_both(client, server);
  ASSERT_EQ(sc, TlsLink::Step::kDone) << client.error();
  ASSERT_EQ(ss, TlsLink::Step::kDone) << server.error();
  EXPECT_TRUE(client.established());

  // Each side writes 8 MiB (odd piece sizes, header-like small pieces among
  // them) on one thread while another thread of the same link reads.
  constexpr size_t kBytes = 8 << 20;
  auto a_data = random_bytes(kBytes, 1), b_data = random_bytes(kBytes, 2);
  std::vector<unsigned char> a_got(kBytes), b_got(kBytes);
  auto writer = [](TlsLink& link, const std::vector<unsigned char>& data) {
    size_t off = 0, piece = 7;
    while (off < data.size()) {
      size_t n = std::min(piece, data.size() - off);
      Status st =
          tls_write_all(link, data.data() + off, n, Clock::now() + std::chrono::seconds(20));
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      off += n;
      piece = piece == 7 ? 300000 : piece == 300000 ? 32 : 7;
    }
  };
  auto reader = [](TlsLink& link, std::vector<unsigned char>& got) {
    Status st = tls_read_all(link, got.data(), got.size(), Clock::now() + std::chrono::seconds(20));
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  };
  std::thread t1(writer, std::ref(client), std::cref(a_data));
  std::thread t2(writer, std::ref(server), std::cref(b_data));
  std::thread t3(reader, std::ref(server), std::ref(a_got));
  std::thread t4(reader, std::ref(client), std::ref(b_got));
  t1.join();
  t2.join();
  t3.join();
  t4.join();
  EXPECT_TRUE(a_got == a_data);
  EXPECT_TRUE(b_got == b_data);
  EXPECT_FALSE(client.output_pending());
}

TEST(Tls, AnotherSecretFailsTheHandshakeOnBothSides) {
  auto [x, y] = socket_pair();
  TlsLink client(context("mine"), x.get(), TlsLink::Side::kClient);
  TlsLink server(context("theirs"), y.get(), TlsLink::Side::kServer);
  auto [sc, ss] = handshake_both(client, server);
  EXPECT_EQ(sc, TlsLink::Step::kFailed);
  EXPECT_EQ(ss, TlsLink::Step::kFailed);
  EXPECT_NE(server.error().find("does not know this job's secret"), std::string::npos)
      << server.error();
}

TEST(Tls, APlainPeerIsRefusedAndAPlainNodeCanTellTlsApart) {
  auto [x, y] = socket_pair();
  TlsLink server(context("s"), y.get(), TlsLink::Side::kServer);
  const char hello[] = "PPxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx this is not a ClientHello";
  ASSERT_EQ(::send(x.get(), hello, sizeof hello, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof hello));
  TlsLink::Step s = TlsLink::Step::kWaiting;
  for (int i = 0; i < 100 && s == TlsLink::Step::kWaiting; ++i)
    s = server.handshake();
  EXPECT_EQ(s, TlsLink::Step::kFailed);

  // A TLS client's first bytes, as a plain node would read them.
  auto [p, q] = socket_pair();
  TlsLink client(context("s"), p.get(), TlsLink::Side::kClient);
  EXPECT_EQ(client.handshake(), TlsLink::Step::kWaiting);
  unsigned char first[8];
  ASSERT_GT(::recv(q.get(), first, sizeof first, 0), 2);
  EXPECT_TRUE(looks_like_tls(first, sizeof first));
  EXPECT_FALSE(looks_like_tls(reinterpret_cast<const unsigned char*>(hello), sizeof hello));
}

TEST(Tls, AnObserverOfTheWireSeesNoPlaintext) {
  // client <-> [b relay c] <-> server; the relay keeps every byte it moves.
  auto [a, b] = socket_pair();
  auto [c, d] = socket_pair();
  auto ctx = context("s");
  TlsLink client(ctx, a.get(), TlsLink::Side::kClient);
  TlsLink server(ctx, d.get(), TlsLink::Side::kServer);
  std::vector<unsigned char> seen;
  std::atomic<bool> stop{false};
  std::thread relay([&] {
    unsigned char buf[65536];
    while (!stop) {
      pollfd p[2] = {{b.get(), POLLIN, 0}, {c.get(), POLLIN, 0}};
      ::poll(p, 2, 20);
      for (int i = 0; i < 2; ++i) {
        int from = i == 0 ? b.get() : c.get(), to = i == 0 ? c.get() : b.get();
        ssize_t r = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
        if (r <= 0) continue;
        seen.insert(seen.end(), buf, buf + r);
        for (ssize_t off = 0; off < r;) {
          ssize_t w = ::send(to, buf + off, static_cast<size_t>(r - off), MSG_NOSIGNAL);
          if (w > 0) off += w;
        }
      }
    }
  });
  auto deadline = Clock::now() + std::chrono::seconds(10);
  std::thread hs([&] {
    Status st = tls_handshake(server, deadline);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  });
  Status st = tls_handshake(client, deadline);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  hs.join();
  const std::string secret = "the weights of layer 3 are 0.1234567";
  std::string payload;
  for (int i = 0; i < 100; ++i)
    payload += secret;
  st = tls_write_all(client, payload.data(), payload.size(), deadline);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  std::string got(payload.size(), '\0');
  st = tls_read_all(server, got.data(), got.size(), deadline);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  stop = true;
  relay.join();
  EXPECT_EQ(got, payload);
  std::string wire(seen.begin(), seen.end());
  EXPECT_GT(wire.size(), payload.size());
  EXPECT_EQ(wire.find("weights of layer"), std::string::npos);
  EXPECT_EQ(wire.find("s3cret"), std::string::npos);
}

TEST(Tls, ContextNeedsASecretAndIsSharedPerJob) {
  EXPECT_THROW(TlsContext("job", ""), InvalidArgument);
  NetOptions off;
  EXPECT_EQ(tls_context(off), nullptr);
  EXPECT_EQ(context("k"), context("k"));
  EXPECT_NE(context("k"), context("other"));
  EXPECT_NE(context("k")->key(), context("other")->key());
}

}  // namespace
}  // namespace pushpull::transport
