// SPDX-License-Identifier: Apache-2.0
// Issue 35 at the net layer, each attack made to happen: a second
// connection claiming a peer this node dialed (not only one it accepted), a
// node without a secret dialing a stranger's address on another host (a
// fake rank 0 behind the rendezvous address), and a flood of
// unauthenticated connections from one source address.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "fixture.h"
#include "support/wait.h"
#include "transport/peer_policy.h"

namespace pushpull::transport {
namespace {

using namespace std::chrono_literals;
using test::config;
using test::RawClient;
using test::Sink;
using test::wait_until;

// A transport that listens too (a node that both dials and accepts).
struct Node {
  explicit Node(TransportConfig c) : t(std::move(c)) {
    t.listen("127.0.0.1", 0);
    t.start();
  }
  ~Node() { t.stop(); }
  MessageTransport t;
};

TEST(PeerClaims, APeerThisNodeDialedCannotBeClaimedByAnotherConnection) {
  auto server = std::make_unique<Sink>(config(Role::kServer, 0, "s3cret"));
  Node worker(config(Role::kWorker, 0, "s3cret"));
  worker.t.connect("127.0.0.1", server->t.port());  // the worker dialed server 0
  ASSERT_EQ(worker.t.connections().size(), 1u);
  {
    // An insider (it has the secret) dials the worker claiming to be server 0.
    RawClient claim(worker.t.port());
    claim.send_hello(RawClient::make_hello(claim.challenge(), "s3cret", Role::kServer, 0));
    HelloAck ack = claim.ack();
    EXPECT_FALSE(ack.accepted) << "a second connection took over the dialed server 0";
    EXPECT_NE(ack.reason.find("already connected"), std::string::npos) << ack.reason;
    EXPECT_NE(ack.reason.find("dialed by this node"), std::string::npos) << ack.reason;
    EXPECT_TRUE(claim.closed_by_peer());
  }
  // (The refused connection leaves the table just after its shutdown.)
  EXPECT_TRUE(wait_until([&] { return worker.t.connections().size() == 1u; }));
  // Once the real server 0 is gone (a replacement after its death or
  // fail-over), the identity is free again.
  server.reset();
  ASSERT_TRUE(wait_until([&] { return worker.t.connections().empty(); }));
  RawClient replacement(worker.t.port());
  replacement.hello("s3cret", Role::kServer, 0);
}

TEST(PeerClaims, WithoutASecretANodeDialsThisMachineOnly) {
  NetOptions open;
  EXPECT_TRUE(dial_refusal(resolve("127.0.0.1", 1), open).is_ok());
  EXPECT_TRUE(dial_refusal(resolve("::1", 1), open).is_ok());
  EXPECT_TRUE(dial_refusal(resolve("10.1.2.3", 1), open, {"10.1.2.3"}).is_ok());  // our own
  const Status refused = dial_refusal(resolve("10.1.2.3", 1), open);
  EXPECT_EQ(refused.code(), ErrorCode::kProtocolError);
  const std::string& why = refused.message();
  EXPECT_NE(why.find("10.1.2.3"), std::string::npos) << why;
  EXPECT_NE(why.find("PUSHPULL_JOB_SECRET"), std::string::npos) << why;
  EXPECT_FALSE(dial_refusal(resolve("::ffff:10.1.2.3", 1), open).is_ok());
  NetOptions secret;
  secret.job_secret = "s";
  EXPECT_TRUE(dial_refusal(resolve("10.1.2.3", 1), secret).is_ok());
  NetOptions insecure;
  insecure.allow_insecure = true;
  EXPECT_TRUE(dial_refusal(resolve("10.1.2.3", 1), insecure).is_ok());
}

// A network namespace (another "host") reached over a veth pair; removed
// with its links at the end.
class OtherHost {
 public:
  OtherHost() {
    // A /24 of its own per process (tests run in parallel): 10.128-191.x.
    const int pid = static_cast<int>(::getpid());
    const std::string net =
        "10." + std::to_string(128 + ((pid >> 8) & 63)) + "." + std::to_string(pid & 255);
    ns_ = "ppdial" + std::to_string(pid);
    here_ = net + ".1";
    there_ = net + ".2";
    const std::string a = "ppd" + std::to_string(::getpid()) + "a";
    const std::string b = "ppd" + std::to_string(::getpid()) + "b";
    link_ = a;
    ok_ = sh("ip netns add " + ns_) && sh("ip link add " + a + " type veth peer name " + b) &&
          sh("ip link set " + b + " netns " + ns_) && sh("ip addr add " + here_ + "/24 dev " + a) &&
          sh("ip link set " + a + " up") &&
          sh("ip netns exec " + ns_ + " ip addr add " + there_ + "/24 dev " + b) &&
          sh("ip netns exec " + ns_ + " ip link set " + b + " up") &&
          sh("ip netns exec " + ns_ + " ip link set lo up");
  }
  ~OtherHost() {
    sh("ip link del " + link_ + " 2>/dev/null");
    sh("ip netns del " + ns_ + " 2>/dev/null");
  }
  bool ok() const { return ok_; }
  const std::string& there() const { return there_; }
  const std::string& here() const { return here_; }
  // Runs `f` on a thread that lives in the namespace (sockets it makes, and
  // threads it starts, belong there).
  template <typename F>
  void inside(F f) {
    std::thread th([&] {
      int fd = ::open(("/var/run/netns/" + ns_).c_str(), O_RDONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::setns(fd, CLONE_NEWNET), 0);
      ::close(fd);
      f();
    });
    th.join();
  }

 private:
  static bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null").c_str()) == 0; }
  std::string ns_, here_, there_, link_;
  bool ok_ = false;
};

// Whoever answers at the address a node without a secret dials is taken as
// the peer it claims, unless the dial is limited to this machine: a fake
// rank 0 on another host, accepting anyone (no secret), is refused by the
// dialer before it says hello.
TEST(PeerClaims, ANodeWithoutASecretRefusesAFakePeerOnAnotherHost) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for a network namespace";
  if (std::system("command -v ip >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs iproute2 (ip)";
  OtherHost other;
  if (!other.ok()) GTEST_SKIP() << "cannot make a network namespace here";
  std::unique_ptr<MessageTransport> fake_public;
  other.inside([&] {
    TransportConfig c = config(Role::kWorker, 0, "");
    c.net.allow_insecure = true;  // the attacker's fake rank 0 takes anyone
    fake_public = std::make_unique<MessageTransport>(c);
    fake_public->listen(other.there(), 0);
    fake_public->start();
  });
  MessageTransport victim(config(Role::kWorker, 1, ""));  // no secret, not insecure
  victim.start();
  try {
    victim.connect(other.there(), fake_public->port(), 2000ms);
    FAIL() << "a node without a secret used a connection to another host";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("this machine only"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(victim.connections().empty());
  EXPECT_TRUE(fake_public->connections().empty() ||
              wait_until([&] { return fake_public->connections().empty(); }, 3000ms));
  // With PUSHPULL_ALLOW_INSECURE=1 the user accepts that risk: it connects.
  TransportConfig c = config(Role::kWorker, 2, "");
  c.net.allow_insecure = true;
  MessageTransport trusting(c);
  trusting.start();
  EXPECT_NO_THROW(trusting.connect(other.there(), fake_public->port(), 2000ms));
  trusting.stop();
  victim.stop();
  fake_public->stop();
}

// What the node sent first within `timeout`: >0 bytes (a challenge), 0
// (closed at once), -1 (nothing yet).
ssize_t first_bytes(int fd, std::chrono::milliseconds timeout) {
  timeval tv{0, static_cast<suseconds_t>(timeout.count() * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[64];
  ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  if (n < 0 && errno == ECONNRESET) return 0;
  return n;
}

Fd dial(const std::string& host, int port) {
  Fd fd;
  Status st = connect_once(resolve(host, port), 2000ms, &fd);
  EXPECT_TRUE(st.is_ok() && fd.valid()) << st.to_string();
  return fd;
}

TEST(PeerClaims, PendingLimitCountsPerAddress) {
  PendingLimit limit(2);
  EXPECT_TRUE(limit.admit("10.0.0.1"));
  EXPECT_TRUE(limit.admit("10.0.0.1"));
  EXPECT_FALSE(limit.admit("10.0.0.1"));
  EXPECT_TRUE(limit.admit("10.0.0.2"));
  limit.release("10.0.0.1");
  EXPECT_EQ(limit.pending("10.0.0.1"), 1u);
  EXPECT_TRUE(limit.admit("10.0.0.1"));
  limit.release("10.9.9.9");  // never counted: nothing happens
  EXPECT_EQ(limit.pending("10.9.9.9"), 0u);
}

// A stranger on another host opens many connections and never
// authenticates: past kMaxPendingPerSource they are closed at once, others
// (this machine) are not affected, and an honest node on that host retries
// until a slot frees.
TEST(PeerClaims, PendingConnectionsFromAnotherHostAreCappedPerAddress) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for a network namespace";
  if (std::system("command -v ip >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs iproute2 (ip)";
  OtherHost other;
  if (!other.ok()) GTEST_SKIP() << "cannot make a network namespace here";
  MessageTransport node(config(Role::kServer, 0, "s3cret"));
  const int port = node.listen(other.here(), 0);
  node.start();
  std::vector<Fd> flood;
  ssize_t over = -2;
  other.inside([&] {
    for (size_t i = 0; i < kMaxPendingPerSource; ++i) {
      flood.push_back(dial(other.here(), port));
      EXPECT_GT(first_bytes(flood.back().get(), 2000ms), 0) << "connection " << i;
    }
    Fd one_more = dial(other.here(), port);
    over = first_bytes(one_more.get(), 2000ms);
  });
  EXPECT_EQ(over, 0) << "connection " << kMaxPendingPerSource + 1 << " was not closed at once";
  // This machine's own addresses are not capped.
  Fd local = dial(other.here(), port);
  EXPECT_GT(first_bytes(local.get(), 2000ms), 0);
  local.reset();
  std::thread release([&] {
    std::this_thread::sleep_for(300ms);
    flood.clear();
  });
  other.inside([&] {
    MessageTransport member(config(Role::kWorker, 0, "s3cret"));
    member.start();
    EXPECT_NO_THROW(member.connect(other.here(), port, 5000ms));
    member.stop();
  });
  release.join();
  node.stop();
}

}  // namespace
}  // namespace pushpull::transport
