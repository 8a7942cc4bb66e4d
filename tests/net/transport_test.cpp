// SPDX-License-Identifier: Apache-2.0
// MessageTransport over loopback TCP and the in-process medium (each
// medium-independent test runs over both): hello, send/receive, posted
// receives, priority, refusals, limits and garbage from raw sockets.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "fixture.h"
#include "support/ports.h"
#include "support/wait.h"
#include "transport/hello.h"
#include "transport/socket.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::transport {
namespace {

using namespace std::chrono_literals;
using test::config;
using test::RawClient;
using test::Sink;
using test::wait_until;

using test::kBlock;
using test::kData;
using test::kReply;

// The tests of what does not depend on the medium run over each of them.
class MessageTransportOn : public test::Medium {};
INSTANTIATE_TEST_SUITE_P(Media, MessageTransportOn, ::testing::ValuesIn(test::kMedia),
                         test::medium_name);

// The automatic socket buffer (NetOptions::socket_buffer_bytes = -1): 256 KiB
// split among a node's tensor peers, 32..128 KiB each; tune_socket applies
// it, and a negative value outside a Node means the 128 KiB default.
TEST(MessageTransport, AutomaticSocketBuffersSplitANodesBudgetAmongItsPeers) {
  EXPECT_EQ(auto_socket_buffer_bytes(0), 128 << 10);
  EXPECT_EQ(auto_socket_buffer_bytes(1), 128 << 10);
  EXPECT_EQ(auto_socket_buffer_bytes(2), 128 << 10);
  EXPECT_EQ(auto_socket_buffer_bytes(4), 64 << 10);
  EXPECT_EQ(auto_socket_buffer_bytes(8), 32 << 10);
  EXPECT_EQ(auto_socket_buffer_bytes(64), 32 << 10);
  auto rcvbuf = [](int requested) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    tune_socket(fd.get(), requested);
    int got = 0;
    socklen_t len = sizeof got;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &got, &len);
    return got;
  };
  // The kernel doubles what it is asked for (bookkeeping overhead).
  EXPECT_EQ(rcvbuf(32 << 10), 2 * (32 << 10));
  EXPECT_EQ(rcvbuf(-1), 2 * kDefaultSocketBufferBytes);
}

// A dead-link timeout turns keepalive on with probes every quarter of it (at
// least 1 s) and bounds unacknowledged data with TCP_USER_TIMEOUT; zero
// leaves the kernel's defaults (chaos.link_cut's pair scenario cuts a real
// link under it).
TEST(MessageTransport, ADeadLinkTimeoutSetsKeepaliveAndTheUserTimeout) {
  auto opt = [](int fd, int level, int name) {
    int got = -1;
    socklen_t len = sizeof got;
    ::getsockopt(fd, level, name, &got, &len);
    return got;
  };
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  set_dead_link_timeout(fd.get(), 10000ms);
  EXPECT_EQ(opt(fd.get(), SOL_SOCKET, SO_KEEPALIVE), 1);
  EXPECT_EQ(opt(fd.get(), IPPROTO_TCP, TCP_KEEPIDLE), 2);
  EXPECT_EQ(opt(fd.get(), IPPROTO_TCP, TCP_KEEPINTVL), 2);
  EXPECT_EQ(opt(fd.get(), IPPROTO_TCP, TCP_USER_TIMEOUT), 10000);
  Fd short_fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  set_dead_link_timeout(short_fd.get(), 2000ms);
  EXPECT_EQ(opt(short_fd.get(), IPPROTO_TCP, TCP_KEEPIDLE), 1);
  EXPECT_EQ(opt(short_fd.get(), IPPROTO_TCP, TCP_USER_TIMEOUT), 2000);
  Fd off(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  set_dead_link_timeout(off.get(), 0ms);
  EXPECT_EQ(opt(off.get(), SOL_SOCKET, SO_KEEPALIVE), 0);
  EXPECT_EQ(opt(off.get(), IPPROTO_TCP, TCP_USER_TIMEOUT), 0);
}

TEST_P(MessageTransportOn, HelloIdentifiesPeersAndMessagesArriveInOrder) {
  Sink a(config(Role::kServer, 0), host());
  MessageTransport b(config(Role::kWorker, 3));
  b.set_advertised_address("127.0.0.1", 4242);
  b.start();
  ConnId c = b.connect(host(), a.t.port());
  auto peer = b.peer(c);
  ASSERT_TRUE(peer);
  EXPECT_EQ(peer->role, Role::kServer);
  EXPECT_EQ(peer->rank, 0);
  for (uint64_t i = 0; i < 1000; ++i) {
    std::string s = fmt::format("message {}", i);
    ASSERT_TRUE(b.send_copy(c, Header{.type = kData, .request_id = i}, s.data(), s.size()).is_ok());
  }
  ASSERT_TRUE(wait_until([&] { return a.count() == 1000; }));
  std::lock_guard l(a.mu);
  ASSERT_EQ(a.peers.size(), 1u);
  EXPECT_EQ(a.peers[0].second.role, Role::kWorker);
  EXPECT_EQ(a.peers[0].second.rank, 3);
  EXPECT_EQ(a.peers[0].second.port, 4242);
  EXPECT_EQ(a.peers[0].second.describe(), "worker 3 (host 127.0.0.1:4242)");
  for (uint64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(a.got[i].header.request_id, i);
    std::string s(reinterpret_cast<const char*>(a.got[i].payload.data()), a.got[i].payload.size());
    EXPECT_EQ(s, fmt::format("message {}", i));
  }
}

TEST_P(MessageTransportOn, ZeroCopySendIntoPostedReceiveAndReply) {
  Sink a(config(Role::kServer, 0), host());
  a.t.set_handler(kReply, kReply, [&](Message&& m) {
    // Echo the request id back, from the I/O thread.
    uint64_t v = m.header.request_id * 2;
    a.t.send_copy(m.conn, Header{.type = kReply, .request_id = m.header.request_id}, &v, sizeof v);
  });
  MessageTransport b(config(Role::kWorker, 0));
  b.set_handler(kReply, kReply, [](Message&&) { ADD_FAILURE() << "reply should be posted"; });
  b.start();
  ConnId c = b.connect(host(), a.t.port());
  ASSERT_TRUE(wait_until([&] { return a.npeers() == 1; }));
  ConnId back = a.peers[0].first;

  // A large payload straight into a posted buffer on the receiver.
  const size_t n = 24 << 20;
  std::vector<uint32_t> src(n / 4), dst(n / 4, 0);
  std::iota(src.begin(), src.end(), 0u);
  std::promise<Status> recv_done, send_done;
  ASSERT_TRUE(a.t.post_recv(back, {kData, 5, 9}, dst.data(), n,
                            [&](const Status& s, const Header& h) {
                              EXPECT_EQ(h.payload_bytes, n);
                              recv_done.set_value(s);
                            })
                  .is_ok());
  EXPECT_FALSE(a.t.post_recv(back, {kData, 5, 9}, dst.data(), n, nullptr).is_ok());
  b.send(c, Header{.type = kData, .request_id = 5, .key = 9}, src.data(), n,
         [&](const Status& s) { send_done.set_value(s); });
  ASSERT_EQ(send_done.get_future().wait_for(20s), std::future_status::ready);
  auto rf = recv_done.get_future();
  ASSERT_EQ(rf.wait_for(20s), std::future_status::ready);
  EXPECT_TRUE(rf.get().is_ok());
  EXPECT_EQ(src, dst);
  EXPECT_EQ(a.count(), 0u);  // nothing reached the handler

  // Request/reply with the reply read into place.
  uint64_t reply = 0;
  std::promise<void> got;
  ASSERT_TRUE(
      b.post_recv(c, {kReply, 21, 0}, &reply, sizeof reply, [&](const Status& s, const Header&) {
         EXPECT_TRUE(s.is_ok());
         got.set_value();
       }).is_ok());
  b.send_copy(c, Header{.type = kReply, .request_id = 21}, nullptr, 0);
  ASSERT_EQ(got.get_future().wait_for(10s), std::future_status::ready);
  EXPECT_EQ(reply, 42u);
}

TEST_P(MessageTransportOn, PostedReceivesNeedNoHandlerAndOversizeFailsThePost) {
  Sink a(config(Role::kServer, 0), host());
  MessageTransport b(config(Role::kWorker, 0));
  b.start();
  ConnId c = b.connect(host(), a.t.port());
  ASSERT_TRUE(wait_until([&] { return a.npeers() == 1; }));
  ConnId back = a.peers[0].first;
  constexpr uint16_t kOnlyPosted = 210;  // no handler registered for it
  char small[4] = {};
  std::promise<Status> first, second;
  ASSERT_TRUE(a.t.post_recv(back, {kOnlyPosted, 1, 0}, small, sizeof small,
                            [&](const Status& s, const Header&) { first.set_value(s); })
                  .is_ok());
  ASSERT_TRUE(a.t.post_recv(back, {kOnlyPosted, 2, 0}, small, sizeof small,
                            [&](const Status& s, const Header&) { second.set_value(s); })
                  .is_ok());
  b.send_copy(c, Header{.type = kOnlyPosted, .request_id = 1}, "abcd", 4);
  b.send_copy(c, Header{.type = kOnlyPosted, .request_id = 2}, "too long", 8);
  EXPECT_TRUE(first.get_future().get().is_ok());
  EXPECT_EQ(std::string(small, 4), "abcd");
  EXPECT_EQ(second.get_future().get().code(), ErrorCode::kProtocolError);
  // The connection survives an oversize post; an unposted message of a
  // handler-less type does not.
  b.send_copy(c, Header{.type = kData}, "ok", 2);
  EXPECT_TRUE(wait_until([&] { return a.count() == 1; }));
  b.send_copy(c, Header{.type = kOnlyPosted, .request_id = 3}, "x", 1);
  EXPECT_TRUE(wait_until([&] { return a.ncloses() == 1; }));
}

TEST_P(MessageTransportOn, HigherPriorityGoesFirstAmongWaitingSends) {
  Sink a(config(Role::kServer, 0), host());
  std::promise<void> release;
  auto released = release.get_future().share();
  a.t.set_handler(kBlock, kBlock, [&](Message&&) { released.wait_for(20s); });
  MessageTransport b(config(Role::kWorker, 0));
  b.start();
  ConnId c = b.connect(host(), a.t.port());
  std::vector<char> big(64 << 20, 'x');
  b.send_copy(c, Header{.type = kBlock}, nullptr, 0);
  b.send(c, Header{.type = kData, .request_id = 0}, big.data(), big.size(), nullptr);
  for (uint64_t id : {1, 2, 3})
    b.send_copy(c, Header{.type = kData, .request_id = id}, "l", 1, 0);
  b.send_copy(c, Header{.type = kData, .request_id = 4}, "h", 1, 5);
  release.set_value();
  ASSERT_TRUE(wait_until([&] { return a.count() == 5; }, 30s));
  std::lock_guard l(a.mu);
  std::vector<uint64_t> order;
  for (auto& m : a.got)
    order.push_back(m.header.request_id);
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 4, 1, 2, 3}));
}

TEST_P(MessageTransportOn, RefusesWrongSecretJobIdAndVersionWithoutRetrying) {
  Sink a(config(Role::kScheduler, 0, "right"), host());
  {
    MessageTransport b(config(Role::kWorker, -1, "wrong"));
    b.start();
    auto t0 = std::chrono::steady_clock::now();
    try {
      b.connect(host(), a.t.port());
      FAIL() << "connected with the wrong secret";
    } catch (const ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find("secret"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);  // no retry loop
  }
  {
    MessageTransport b(config(Role::kWorker, -1, "right", "other-job"));
    b.start();
    try {
      b.connect(host(), a.t.port());
      FAIL() << "connected with the wrong job id";
    } catch (const ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find("job id"), std::string::npos) << e.what();
    }
  }
  {
    auto cfg = config(Role::kWorker, -1, "right");
    cfg.protocol_version = kProtocolVersion + 1;
    MessageTransport b(cfg);
    b.start();
    try {
      b.connect(host(), a.t.port());
      FAIL() << "connected with another protocol version";
    } catch (const ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find("version"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(a.npeers(), 0u);
  MessageTransport ok(config(Role::kWorker, -1, "right"));
  ok.start();
  ConnId c = ok.connect(host(), a.t.port());
  ok.send_copy(c, Header{.type = kData}, "a", 1);
  EXPECT_TRUE(wait_until([&] { return a.count() == 1; }));
}

TEST_P(MessageTransportOn, ConnectTimesOutNamingTheAddress) {
  MessageTransport b(config(Role::kWorker, 0));
  b.start();
  int port = test::free_port();
  auto t0 = std::chrono::steady_clock::now();
  try {
    b.connect(host(), port, 400ms);
    FAIL();
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("{}:{}", host(), port)), std::string::npos);
  }
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 350ms);
  EXPECT_LT(took, 3s);
}

TEST_P(MessageTransportOn, ConnectRetriesUntilTheListenerAppears) {
  int port = test::free_port();
  MessageTransport b(config(Role::kWorker, 0));
  b.start();
  auto fut = std::async(std::launch::async, [&] { return b.connect(host(), port, 5s); });
  std::this_thread::sleep_for(300ms);
  MessageTransport a(config(Role::kServer, 0));
  a.listen(host(), port);
  a.start();
  EXPECT_GT(fut.get(), 0u);
}

TEST(MessageTransport, Ipv6Loopback) {
  auto cfg = config(Role::kServer, 0);
  MessageTransport a(cfg);
  try {
    a.listen("::1", 0);
  } catch (const Error&) {
    GTEST_SKIP() << "no IPv6 loopback here";
  }
  std::atomic<int> got{0};
  a.set_handler(kData, kData, [&](Message&&) { ++got; });
  a.start();
  MessageTransport b(config(Role::kWorker, 0));
  b.start();
  ConnId c = b.connect("::1", a.port());
  b.send_copy(c, Header{.type = kData}, "v6", 2);
  EXPECT_TRUE(wait_until([&] { return got == 1; }));
}

TEST_P(MessageTransportOn, GarbageClosesOnlyThatConnection) {
  Sink a(config(Role::kServer, 0), host());
  MessageTransport good(config(Role::kWorker, 0));
  good.start();
  ConnId gc = good.connect(host(), a.t.port());
  auto check_alive = [&](size_t expect) {
    good.send_copy(gc, Header{.type = kData}, "ok", 2);
    EXPECT_TRUE(wait_until([&] { return a.count() == expect; }));
  };
  {  // random bytes instead of a hello
    RawClient r(a.t.port(), host());
    std::mt19937 rng(1);
    std::vector<char> junk(10000);
    for (auto& c : junk)
      c = static_cast<char>(rng());
    r.raw(junk.data(), junk.size());
    EXPECT_TRUE(r.closed_by_peer());
  }
  check_alive(1);
  {  // valid header with a huge length after a proper hello
    RawClient r(a.t.port(), host());
    r.hello();
    r.write(Header{.type = kData, .payload_bytes = uint64_t{1} << 50}, {});
    EXPECT_TRUE(r.closed_by_peer());
  }
  check_alive(2);
  {  // an unknown message type
    RawClient r(a.t.port(), host());
    r.hello();
    r.write(Header{.type = 250}, {});
    EXPECT_TRUE(r.closed_by_peer());
  }
  check_alive(3);
  {  // a truncated message, then the peer goes away
    RawClient r(a.t.port(), host());
    r.hello();
    auto hb = encode_header(Header{.type = kData, .payload_bytes = 1000});
    r.raw(hb.data(), hb.size());
    r.raw("short", 5);
  }
  check_alive(4);
  // Each accepted-then-broken connection reported its close.
  EXPECT_TRUE(wait_until([&] { return a.ncloses() == 3; }));
  std::lock_guard l(a.mu);
  EXPECT_EQ(a.closes[0].code(), ErrorCode::kProtocolError);
  EXPECT_EQ(a.closes[1].code(), ErrorCode::kProtocolError);
}

TEST_P(MessageTransportOn, PendingOperationsFailWhenThePeerGoesAway) {
  auto a = std::make_unique<Sink>(config(Role::kServer, 0), host());
  MessageTransport b(config(Role::kWorker, 0));
  std::promise<Status> closed;
  b.set_close_handler([&](ConnId, const PeerInfo& p, const Status& s) {
    EXPECT_EQ(p.role, Role::kServer);
    closed.set_value(s);
  });
  b.start();
  ConnId c = b.connect(host(), a->t.port());
  uint64_t slot = 0;
  std::promise<Status> recv;
  ASSERT_TRUE(b.post_recv(c, {kReply, 1, 0}, &slot, 8, [&](const Status& s, const Header&) {
                 recv.set_value(s);
               }).is_ok());
  a.reset();
  auto rf = recv.get_future();
  ASSERT_EQ(rf.wait_for(10s), std::future_status::ready);
  Status s = rf.get();
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("server 0"), std::string::npos) << s.message();
  ASSERT_EQ(closed.get_future().wait_for(10s), std::future_status::ready);
  std::promise<Status> sent;
  b.send(c, Header{.type = kData}, "x", 1, [&](const Status& st) { sent.set_value(st); });
  EXPECT_FALSE(sent.get_future().get().is_ok());
}

}  // namespace
}  // namespace pushpull::transport
