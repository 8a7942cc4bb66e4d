// SPDX-License-Identifier: Apache-2.0
// The collectives' data streams against strangers and impostors: the
// streams are opened with the net hello marked as a stream on each rank's
// one listening port (transport/tcp/message_transport.h, "Streams"), so a stranger's silent,
// garbage or unproven connection to that port is refused and logged and
// never fails the group; a member claiming another rank, and a message
// connection's proof, cannot open a stream; TLS groups get encrypted
// streams and refuse plain connections; a verdict ends the wait for
// streams; and a bad request at the rendezvous closes only its connection.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <future>
#include <thread>

#include "collective/algorithms.h"
#include "collective/bootstrap.h"
#include "collective/tcp_store.h"
#include "harness.h"
#include "net/fixture.h"
#include "support/ports.h"
#include "tcp_group.h"
#include "transport/tcp/message_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::collective {

using transport::Clock;
using transport::kVerdictType;
using transport::TcpTransport;

namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using test::RawClient;

NetOptions group_net(const std::string& secret = "s3cret", bool tls = false) {
  NetOptions n;
  n.job_id = "job";
  n.job_secret = secret;
  n.tls = tls;
  n.connect_timeout = 8s;
  n.handshake_timeout = 3s;
  return n;
}

struct Group {
  std::vector<std::unique_ptr<TcpTransport>> ts;
  std::vector<std::pair<std::string, int>> book;
  Group(int n, const NetOptions& net) {
    for (int r = 0; r < n; ++r) {
      ts.push_back(std::make_unique<TcpTransport>(r, n, net, "127.0.0.1"));
      book.emplace_back("127.0.0.1", ts.back()->port());
    }
  }
  // connect_all on a thread per rank; the first error is rethrown.
  void connect() {
    testing::on_threads(static_cast<int>(ts.size()), [&](int r) { ts[r]->connect_all(book); });
  }
  // An allreduce of (rank + 1) on every rank, on the streams: every rank
  // must get n (n + 1) / 2 in each element.
  void check_allreduce(size_t count = 300000) {
    const int n = static_cast<int>(ts.size());
    std::vector<std::thread> th;
    std::vector<std::vector<float>> out(ts.size());
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(ts[r]->has_streams());
      for (int q = 0; q < n; ++q)
        if (q != r) EXPECT_GE(ts[r]->stream_fd(q), 0) << r << " -> " << q;
    }
    for (int r = 0; r < n; ++r)
      th.emplace_back([&, r] {
        std::vector<char> scratch;
        AlgoContext ctx{*ts[r]};
        ctx.scratch = &scratch;
        ctx.op_id = 1;
        out[r].assign(count, static_cast<float>(r + 1));
        try {
          allreduce(ctx, out[r].data(), count, DType::kFloat32, ReduceOp::kSum);
        } catch (const Error& e) {
          ADD_FAILURE() << "rank " << r << ": " << e.what();
        }
      });
    for (auto& t : th)
      t.join();
    const float want = static_cast<float>(n * (n + 1) / 2);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(out[r].size(), count);
      EXPECT_EQ(out[r].front(), want);
      EXPECT_EQ(out[r].back(), want);
    }
  }
};

// Everything this process writes to stderr while it lives (the log).
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    file_ = mkstemp(path_);
    saved_ = dup(2);
    dup2(file_, 2);
  }
  ~StderrCapture() { restore(); }
  std::string text() {
    restore();
    std::ifstream in(path_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, 2);
    ::close(saved_);
    ::close(file_);
    saved_ = -1;
  }
  char path_[40] = "/tmp/pushpull_stream_authXXXXXX";
  int file_ = -1, saved_ = -1;
};

// A stream hello to `port` from `rank`, proven with `secret` for
// (proof_rank, proof_kind); returns the acceptor's ack.
transport::HelloAck forged_stream(int port, const std::string& secret, int rank, int proof_rank,
                                  transport::HelloKind proof_kind = transport::HelloKind::kStream) {
  RawClient r(port);
  transport::Challenge ch = r.challenge();
  transport::Hello h = RawClient::make_hello(ch, secret, Role::kWorker, proof_rank, "job",
                                             transport::HelloKind::kStream, proof_kind);
  h.rank = rank;
  r.send_hello(h);
  transport::HelloAck ack = r.ack();
  EXPECT_TRUE(r.closed_by_peer());
  return ack;
}

TEST(StreamAuth, StrangersAtThePortAreRefusedLoggedAndNeverFailTheGroup) {
  StderrCapture log;
  Group g(3, group_net());
  const int port = g.book[0].second;
  // Silent connections, garbage, and stream hellos without the secret, all
  // at rank 0's one port before the group connects.
  std::vector<std::unique_ptr<RawClient>> silent;
  for (int i = 0; i < 16; ++i)
    silent.push_back(std::make_unique<RawClient>(port));
  for (int i = 0; i < 4; ++i) {
    RawClient garbage(port);
    garbage.raw("garbage!garbage!garbage!garbage!garbage!garbage!garbage!garbage!", 64);
    EXPECT_TRUE(garbage.closed_by_peer());
  }
  for (int rank : {1, 2}) {
    transport::HelloAck ack = forged_stream(port, "not the secret", rank, rank);
    EXPECT_FALSE(ack.accepted);
    EXPECT_THAT(ack.reason, HasSubstr("authentication failed"));
  }
  const auto t0 = Clock::now();
  g.connect();
  // Well before the silent ones' 3 s handshake deadline.
  EXPECT_LT(Clock::now() - t0, 2500ms);
  g.check_allreduce();
  for (auto& s : silent)
    EXPECT_TRUE(s->closed_by_peer(10s));
  // Logged, one line per address every few seconds (transport::RefusalLog).
  EXPECT_THAT(log.text(), HasSubstr("refused connection from 127.0.0.1"));
}

// A member knows the secret but proves rank 1 while claiming rank 2, or
// proves a message connection while asking for a stream: both refused, and
// the real ranks still get their streams.
TEST(StreamAuth, AnotherRanksProofOrAMessageProofOpensNoStream) {
  Group g(3, group_net());
  const int port = g.book[0].second;
  transport::HelloAck ack = forged_stream(port, "s3cret", 2, 1);
  EXPECT_FALSE(ack.accepted);
  EXPECT_THAT(ack.reason, HasSubstr("authentication failed"));
  ack = forged_stream(port, "s3cret", 1, 1, transport::HelloKind::kMessages);
  EXPECT_FALSE(ack.accepted);
  EXPECT_THAT(ack.reason, HasSubstr("authentication failed"));
  // Out of the group's range, though proven.
  ack = forged_stream(port, "s3cret", 3, 3);
  EXPECT_FALSE(ack.accepted);
  EXPECT_THAT(ack.reason, HasSubstr("may not open a data stream"));
  g.connect();
  g.check_allreduce();
}

// A rank that died before opening its stream (its verdict reaches rank 0)
// ends rank 0's wait at once, not at the connect deadline.
TEST(StreamAuth, AVerdictEndsTheWaitForStreams) {
  NetOptions net = group_net();
  net.connect_timeout = 20s;
  TcpTransport zero(0, 2, net, "127.0.0.1");
  auto waiting = std::async(std::launch::async, [&] {
    zero.connect_all({{"127.0.0.1", zero.port()}, {"127.0.0.1", 1}});
  });
  // "Rank 1": its message connection, then a verdict instead of a stream.
  transport::TransportConfig tc;
  tc.net = net;
  tc.role = Role::kWorker;
  tc.rank = 1;
  transport::MessageTransport one(tc);
  one.start();
  transport::ConnId c = one.connect("127.0.0.1", zero.port());
  std::this_thread::sleep_for(300ms);
  const std::string why = "rank 1 died before its stream";
  ASSERT_TRUE(one.send_copy(c, transport::Header{.type = kVerdictType}, why.data(), why.size()));
  const auto t0 = Clock::now();
  ASSERT_EQ(waiting.wait_for(10s), std::future_status::ready);
  EXPECT_LT(Clock::now() - t0, 5s);
  try {
    waiting.get();
    ADD_FAILURE() << "connect_all succeeded without rank 1's stream";
  } catch (const PeerFailure& e) {
    EXPECT_THAT(e.what(), HasSubstr(why));
  }
}

// With TLS (PUSHPULL_TLS) the streams are TLS links; a plain connector, and
// one with TLS but another secret, are refused without failing the group.
TEST(StreamAuthTls, MembersGetEncryptedStreamsStrangersAreRefused) {
  Group g(2, group_net("s3cret", true));
  const int port = g.book[0].second;
  {
    RawClient plain(port);  // speaks no TLS: the TLS handshake fails
    plain.raw("garbage!garbage!garbage!garbage!garbage!garbage!garbage!garbage!", 64);
    EXPECT_TRUE(plain.closed_by_peer());
  }
  transport::TransportConfig tc;
  tc.net = group_net("another", true);
  tc.role = Role::kWorker;
  tc.rank = 1;
  transport::MessageTransport other(tc);
  other.start();
  EXPECT_THROW(other.open_stream("127.0.0.1", port, Role::kWorker, 0, 3s), ProtocolError);
  tc.net = group_net("s3cret", false);
  transport::MessageTransport plain(tc);
  plain.start();
  EXPECT_THROW(plain.open_stream("127.0.0.1", port, Role::kWorker, 0, 1s), Error);
  g.connect();
  EXPECT_NE(g.ts[0]->stream_tls(1), nullptr);
  EXPECT_NE(g.ts[1]->stream_tls(0), nullptr);
  g.check_allreduce();
}

// Without a secret the hello's rule holds for streams too (only this
// machine's peers: transport/peer_policy.h, tested in tests/net/auth_policy_test.cpp);
// on this machine the group gets its streams.
TEST(StreamAuth, WithoutASecretTheGroupOnThisMachineGetsStreams) {
  Group g(3, group_net(""));
  g.connect();
  g.check_allreduce();
}

Options rv(int rank, int size, int port) {
  return testing::master_addr_options("rv-auth", rank, size, port);
}

AddressList meet(int rank, int size, int port) {
  const auto deadline = Clock::now() + 8s;
  TcpStore store(rv(rank, size, port), deadline);
  return exchange_book(store, rank, size, "127.0.0.1", 1000 + rank, deadline);
}

// The MASTER_ADDR store (tcp_store.h) refuses what a member may not do.
TEST(RendezvousAuth, ABadRequestClosesOnlyItsConnection) {
  const int port = test::free_port();
  auto host = std::async(std::launch::async, [&] { return meet(0, 3, port); });
  // Strangers that passed the net hello (no secret, loopback) but claim an
  // out-of-range rank, set another rank's key, or send garbage.
  auto stranger = [&](int identity, uint16_t type, std::vector<std::byte> request) {
    transport::TransportConfig tc;
    tc.net = rv(0, 3, port).net;
    tc.role = Role::kWorker;
    tc.rank = identity;
    transport::MessageTransport t(tc);
    std::promise<std::string> refused;
    t.set_handler(kStoreReply, kStoreReply, [&](transport::Message&& m) {
      EXPECT_NE(m.header.flags, 0u) << "refused with an error code";
      refused.set_value(
          std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size()));
    });
    t.start();
    transport::ConnId c = t.connect("127.0.0.1", port, 5s);
    t.send_copy(c, transport::Header{.type = type, .request_id = 1}, request.data(),
                request.size());
    auto f = refused.get_future();
    EXPECT_EQ(f.wait_for(5s), std::future_status::ready);
    return f.get();
  };
  const auto entry = encode_entry(3, "127.0.0.1", 1);
  EXPECT_THAT(stranger(7, kStoreSet, encode_store_request("rank/7", entry)),
              HasSubstr("out of range"));
  EXPECT_THAT(stranger(7, kStoreGet, encode_store_request("book", {})), HasSubstr("out of range"));
  EXPECT_THAT(stranger(2, kStoreSet, encode_store_request("rank/1", entry)),
              HasSubstr("not the rank it connected as"));
  EXPECT_THAT(stranger(1, kStoreSet, {std::byte{1}, std::byte{2}}), HasSubstr("malformed"));
  // A refused member never set its key: the real ranks 1 and 2 still meet.
  auto two = std::async(std::launch::async, [&] { return meet(2, 3, port); });
  AddressList book = meet(1, 3, port);
  ASSERT_EQ(book.size(), 3u);
  EXPECT_EQ(book[1].second, 1001);
  EXPECT_EQ(book[2].second, 1002);
  EXPECT_EQ(two.get(), book);
  EXPECT_EQ(host.get(), book);
}

}  // namespace
}  // namespace pushpull::collective
