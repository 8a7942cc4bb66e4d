// SPDX-License-Identifier: Apache-2.0
// Secure by default at the net layer: mutual authentication bound to
// identity (wrong-secret acceptors, replayed, reflected and re-targeted
// proofs), duplicate identities, the authenticated sender, strangers that
// stay silent, disconnect or send too much, handler exceptions. The
// no-secret peer policy, bind addresses, held hellos and limits:
// auth_policy_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "fixture.h"
#include "support/wait.h"
#include "transport/node_id.h"

namespace pushpull::transport {
namespace {

using namespace std::chrono_literals;
using test::config;
using test::RawClient;
using test::Sink;
using test::wait_until;

using test::kData;

// A fake acceptor on a raw socket: sends a challenge, reads the hello and
// answers with an ack whose proof `forge` makes from the hello it got.
class FakeAcceptor {
 public:
  using Forge = std::function<Proof(const Challenge&, const Hello&)>;
  explicit FakeAcceptor(Forge forge) : forge_(std::move(forge)) {
    listener_ = listen_on("127.0.0.1", 0);
    set_nonblocking(listener_.get(), false);
    port_ = local_port(listener_.get());
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeAcceptor() {
    ::shutdown(listener_.get(), SHUT_RDWR);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  void serve() {
    Fd fd(::accept(listener_.get(), nullptr, nullptr));
    if (!fd.valid()) return;
    auto deadline = std::chrono::steady_clock::now() + 5s;
    Challenge ch{kProtocolVersion, job_tag("job"), random_nonce()};
    send(fd.get(), msg::kChallenge, encode(ch), deadline);
    HeaderBytes hb;
    Header h;
    if (!read_all(fd.get(), hb.data(), hb.size(), deadline)) return;
    if (!decode_header(hb, kMaxHandshakeBytes, &h).is_ok()) return;
    std::vector<std::byte> p(h.payload_bytes);
    if (!read_all(fd.get(), p.data(), p.size(), deadline)) return;
    Hello hello;
    if (!decode(p, &hello).is_ok()) return;
    HelloAck ack{true, "", Role::kServer, 0, forge_(ch, hello)};
    send(fd.get(), msg::kHelloAck, encode(ack), deadline);
    char c;
    (void)read_all(fd.get(), &c, 1, deadline);  // until the connector hangs up
  }
  static void send(int fd, uint16_t type, const std::vector<std::byte>& payload,
                   std::chrono::steady_clock::time_point deadline) {
    auto hb = encode_header(Header{.type = type, .payload_bytes = payload.size()});
    // The connector may hang up mid-way: what it saw is what the test checks.
    if (write_all(fd, hb.data(), hb.size(), deadline))
      (void)write_all(fd, payload.data(), payload.size(), deadline);
  }
  Forge forge_;
  Fd listener_;
  int port_ = 0;
  std::thread thread_;
};

void expect_connector_refuses(const FakeAcceptor::Forge& forge) {
  FakeAcceptor fake(forge);
  MessageTransport b(config(Role::kWorker, 1, "right"));
  b.start();
  try {
    b.connect("127.0.0.1", fake.port());
    FAIL() << "the connector accepted an acceptor that did not prove the secret";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("authentication failed"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(b.connections().empty());
}

TEST(Auth, ConnectorRefusesAnAcceptorWithTheWrongSecret) {
  expect_connector_refuses([](const Challenge& ch, const Hello& h) {
    return compute_proof("wrong",
                         {Direction::kAcceptor, ch.nonce, h.nonce, "job", Role::kServer, 0});
  });
  expect_connector_refuses([](const Challenge&, const Hello&) { return Proof{}; });
}

TEST(Auth, ConnectorRefusesItsOwnProofReflected) {
  // The connector's proof is for the other direction: handing it back fails.
  expect_connector_refuses([](const Challenge&, const Hello& h) { return h.proof; });
}

TEST(Auth, AcceptorRefusesAReplayedHello) {
  Sink a(config(Role::kServer, 0, "s3cret"));
  Hello recorded;
  {  // A legitimate exchange, recorded by an eavesdropper.
    RawClient r(a.t.port());
    recorded = RawClient::make_hello(r.challenge(), "s3cret", Role::kWorker, 1);
    r.send_hello(recorded);
    ASSERT_TRUE(r.ack().accepted);
  }
  EXPECT_TRUE(wait_until([&] { return a.npeers() == 1; }));
  RawClient replay(a.t.port());
  (void)replay.challenge();  // a fresh nonce the recorded proof does not cover
  replay.send_hello(recorded);
  HelloAck ack = replay.ack();
  EXPECT_FALSE(ack.accepted);
  EXPECT_NE(ack.reason.find("authentication failed"), std::string::npos) << ack.reason;
  EXPECT_TRUE(replay.closed_by_peer());
  EXPECT_EQ(a.npeers(), 1u);
}

TEST(Auth, AcceptorRefusesAProofForAnotherIdentity) {
  Sink a(config(Role::kServer, 0, "s3cret"));
  RawClient r(a.t.port());
  Hello h = RawClient::make_hello(r.challenge(), "s3cret", Role::kWorker, 1);
  h.rank = 2;  // claims worker 2 with worker 1's proof
  r.send_hello(h);
  HelloAck ack = r.ack();
  EXPECT_FALSE(ack.accepted);
  EXPECT_NE(ack.reason.find("authentication failed"), std::string::npos) << ack.reason;
  RawClient s(a.t.port());
  Hello g = RawClient::make_hello(s.challenge(), "s3cret", Role::kWorker, 1);
  g.role = Role::kServer;  // same rank, another role
  s.send_hello(g);
  EXPECT_FALSE(s.ack().accepted);
  EXPECT_EQ(a.npeers(), 0u);
}

TEST(Auth, AcceptorProvesItsIdentityToTheConnector) {
  Sink a(config(Role::kServer, 3, "s3cret"));
  MessageTransport b(config(Role::kWorker, 1, "s3cret"));
  b.start();
  ConnId c = b.connect("127.0.0.1", a.t.port());
  auto p = b.peer(c);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->role, Role::kServer);
  EXPECT_EQ(p->rank, 3);
}

TEST(Auth, ADuplicateIdentityIsRefusedUntilTheFirstLeaves) {
  Sink a(config(Role::kServer, 0, "s3cret"));
  auto first = std::make_unique<RawClient>(a.t.port());
  first->hello("s3cret", Role::kWorker, 4);
  EXPECT_TRUE(wait_until([&] { return a.npeers() == 1; }));
  {
    RawClient second(a.t.port());
    second.send_hello(RawClient::make_hello(second.challenge(), "s3cret", Role::kWorker, 4));
    HelloAck ack = second.ack();
    EXPECT_FALSE(ack.accepted);
    EXPECT_NE(ack.reason.find("already connected"), std::string::npos) << ack.reason;
    EXPECT_TRUE(second.closed_by_peer());
  }
  first.reset();
  EXPECT_TRUE(wait_until([&] { return a.ncloses() == 1; }));
  RawClient again(a.t.port());
  again.hello("s3cret", Role::kWorker, 4);
  EXPECT_TRUE(wait_until([&] { return a.npeers() == 2; }));
}

// A node registering with the scheduler says hello without a rank; once the
// scheduler assigns one, the connection is that identity: a second connection
// claiming it is refused and the first one's messages carry it.
TEST(Auth, ARankBoundAfterTheHelloCannotBeClaimedAgain) {
  Sink a(config(Role::kScheduler, 0, "s3cret"));
  RawClient first(a.t.port());
  first.hello("s3cret", Role::kWorker, -1);
  ASSERT_TRUE(wait_until([&] { return a.npeers() == 1; }));
  ConnId id;
  {
    std::lock_guard l(a.mu);
    id = a.peers[0].first;
  }
  EXPECT_TRUE(a.t.bind_peer_rank(id, 0));
  EXPECT_TRUE(a.t.bind_peer_rank(id, 0));   // idempotent
  EXPECT_FALSE(a.t.bind_peer_rank(id, 1));  // never rebound
  EXPECT_EQ(a.t.peer(id)->rank, 0);
  RawClient insider(a.t.port());
  insider.send_hello(RawClient::make_hello(insider.challenge(), "s3cret", Role::kWorker, 0));
  HelloAck ack = insider.ack();
  EXPECT_FALSE(ack.accepted);
  EXPECT_NE(ack.reason.find("already connected"), std::string::npos) << ack.reason;
  first.write(Header{.type = kData, .payload_bytes = 1}, std::vector<std::byte>{std::byte{1}});
  ASSERT_TRUE(wait_until([&] { return a.count() == 1; }));
  std::lock_guard l(a.mu);
  EXPECT_EQ(a.got[0].header.sender, node_id(Role::kWorker, 0));
}

TEST(Auth, SenderIsTheAuthenticatedIdentity) {
  Sink a(config(Role::kServer, 0, "s3cret"));
  RawClient r(a.t.port());
  r.hello("s3cret", Role::kWorker, 5);
  // Claims to be the scheduler in the header.
  r.write(Header{.type = kData, .sender = node_id(Role::kScheduler, 0), .payload_bytes = 1},
          std::vector<std::byte>{std::byte{1}});
  ASSERT_TRUE(wait_until([&] { return a.count() == 1; }));
  std::lock_guard l(a.mu);
  EXPECT_EQ(a.got[0].header.sender, node_id(Role::kWorker, 5));
  auto [role, rank] = node_of_id(a.got[0].header.sender);
  EXPECT_EQ(role, Role::kWorker);
  EXPECT_EQ(rank, 5);
}

TEST(Auth, SilentStrangersDoNotDelayARealPeerAndNeverReachTheCloseHandler) {
  auto cfg = config(Role::kServer, 0, "s3cret");
  cfg.net.handshake_timeout = 3s;
  Sink a(cfg);
  std::vector<std::unique_ptr<RawClient>> silent;
  for (int i = 0; i < 64; ++i)
    silent.push_back(std::make_unique<RawClient>(a.t.port()));
  MessageTransport b(config(Role::kWorker, 0, "s3cret"));
  b.start();
  ConnId c = b.connect("127.0.0.1", a.t.port());
  // Served while every stranger is still pending (none expired yet): read the
  // challenge, then nothing more has come (no EOF).
  for (auto& s : silent) {
    (void)s->challenge();
    char byte;
    EXPECT_LT(::recv(s->fd(), &byte, 1, MSG_DONTWAIT), 0);
  }
  // The strangers are closed at their own deadline.
  for (auto& s : silent)
    EXPECT_TRUE(s->closed_by_peer(10s));
  {  // others just connect and leave, or send garbage and leave
    for (int i = 0; i < 20; ++i) {
      RawClient r(a.t.port());
      if (i % 2) r.raw("garbage!", 8);
    }
  }
  b.send_copy(c, Header{.type = kData}, "x", 1);
  EXPECT_TRUE(wait_until([&] { return a.count() == 1; }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(a.npeers(), 1u);
  EXPECT_EQ(a.ncloses(), 0u);
}

TEST(Auth, OversizePreAuthenticationInputIsClosed) {
  Sink a(config(Role::kServer, 0, "s3cret"));
  RawClient r(a.t.port());
  (void)r.challenge();
  r.write(Header{.type = msg::kHello, .payload_bytes = kMaxHelloBytes + 1}, {});
  HelloAck ack = r.ack();  // told why
  EXPECT_FALSE(ack.accepted);
  EXPECT_TRUE(r.closed_by_peer());
  // A hello whose header is fine but whose host is too long.
  RawClient t(a.t.port());
  Hello big = RawClient::make_hello(t.challenge(), "s3cret", Role::kWorker, 2);
  big.host.assign(kMaxHelloHost + 1, 'x');
  t.send_hello(big);
  EXPECT_FALSE(t.ack().accepted);
  // The largest valid hello fits the cap.
  RawClient u(a.t.port());
  Hello largest = RawClient::make_hello(u.challenge(), "s3cret", Role::kWorker, 3);
  largest.host.assign(kMaxHelloHost, 'h');
  EXPECT_EQ(encode(largest).size(), kMaxHelloBytes);
  u.send_hello(largest);
  EXPECT_TRUE(u.ack().accepted);
  EXPECT_TRUE(wait_until([&] { return a.npeers() == 1; }));
  EXPECT_EQ(a.ncloses(), 0u);
}

TEST(Auth, AHandlerExceptionClosesOnlyThatConnection) {
  std::atomic<int> ok{0};
  // Declared before srv: its I/O thread may run the close handler (which uses
  // them) until srv is destroyed, when `good` and `bad` go away first.
  std::mutex mu;
  std::vector<Status> closes;
  MessageTransport srv(config(Role::kServer, 0, "s3cret"));
  srv.listen("127.0.0.1", 0);
  srv.set_handler(kData, kData, [&](Message&& m) {
    if (m.payload.size() == 4) throw std::runtime_error("bad input");
    ++ok;
  });
  srv.set_close_handler([&](ConnId, const PeerInfo&, const Status& s) {
    std::lock_guard l(mu);
    closes.push_back(s);
    throw std::logic_error("the close handler throws too");
  });
  srv.start();
  MessageTransport good(config(Role::kWorker, 0, "s3cret")),
      bad(config(Role::kWorker, 1, "s3cret"));
  good.start();
  bad.start();
  ConnId g = good.connect("127.0.0.1", srv.port());
  ConnId b = bad.connect("127.0.0.1", srv.port());
  bad.send_copy(b, Header{.type = kData}, "boom", 4);
  ASSERT_TRUE(wait_until([&] {
    std::lock_guard l(mu);
    return closes.size() == 1;
  }));
  {
    std::lock_guard l(mu);
    EXPECT_EQ(closes[0].code(), ErrorCode::kInternal);
    EXPECT_NE(closes[0].message().find("bad input"), std::string::npos);
  }
  good.send_copy(g, Header{.type = kData}, "x", 1);
  EXPECT_TRUE(wait_until([&] { return ok == 1; }));
  // A connect handler that throws closes that connection only.
  MessageTransport srv2(config(Role::kServer, 1, "s3cret"));
  srv2.listen("127.0.0.1", 0);
  srv2.set_connect_handler([](ConnId, const PeerInfo&) { throw std::runtime_error("nope"); });
  srv2.start();
  MessageTransport c(config(Role::kWorker, 2, "s3cret"));
  c.start();
  (void)c.connect("127.0.0.1", srv2.port());
  EXPECT_TRUE(wait_until([&] { return srv2.connections().empty(); }));
  (void)c.connect("127.0.0.1", srv2.port());  // still serving
}

}  // namespace
}  // namespace pushpull::transport
