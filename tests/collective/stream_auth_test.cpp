// SPDX-License-Identifier: Apache-2.0
// The collectives' data-stream handshake (stream_handshake.h) and the
// rendezvous against strangers: silent connections do not delay real ranks,
// a wrong token, a proof for another rank, an out-of-range or duplicate rank
// and an impostor listener are refused, and a bad hello at the rendezvous
// closes only its own connection.
#include "collective/stream_handshake.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <future>
#include <thread>

#include "collective/bootstrap.h"
#include "collective/tcp_store.h"
#include "net/transport.h"
#include "support/ports.h"

namespace pushpull::collective {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

StreamAuth auth(const std::string& secret = "s3cret") {
  StreamAuth a{"job", secret, net::random_nonce(), false, nullptr};
  return a;
}

net::Fd raw_connect(int port) {
  net::Fd fd;
  Status st = net::connect_once(net::resolve("127.0.0.1", port), 2s, &fd);
  EXPECT_TRUE(st.is_ok() && fd.valid()) << st.to_string();
  return fd;
}

TEST(StreamAuth, SilentConnectionsDoNotDelayRealRanks) {
  net::Fd listener = net::listen_on("127.0.0.1", 0);
  const int port = net::local_port(listener.get());
  StreamAuth a = auth();
  std::vector<net::Fd> silent;
  for (int i = 0; i < 16; ++i)
    silent.push_back(raw_connect(port));
  auto deadline = Clock::now() + 10s;
  std::vector<std::future<Stream>> ranks;
  for (int q = 1; q <= 2; ++q)
    ranks.push_back(std::async(std::launch::async, [&, q] {
      return connect_stream("127.0.0.1", port, a, q, 0, deadline, "test");
    }));
  auto t0 = Clock::now();
  auto fds = accept_streams(listener.get(), a, 0, 3, deadline, 5s, "test");
  EXPECT_LT(Clock::now() - t0, 4s);  // well before the silent ones' 5 s handshake deadline
  EXPECT_TRUE(fds[1].fd.valid());
  EXPECT_TRUE(fds[2].fd.valid());
  for (auto& r : ranks)
    EXPECT_TRUE(r.get().fd.valid());
}

// A rank that died before opening its stream (the transport's verdict says
// so) ends the accept at once, not at the deadline.
TEST(StreamAuth, AVerdictEndsTheAcceptBeforeItsDeadline) {
  net::Fd listener = net::listen_on("127.0.0.1", 0);
  StreamAuth a = auth();
  const auto t0 = Clock::now();
  auto abandon = [&]() -> std::optional<Status> {
    if (Clock::now() - t0 < 300ms) return std::nullopt;
    return Status(ErrorCode::kPeerFailure, "rank 1 died");
  };
  EXPECT_THROW(accept_streams(listener.get(), a, 0, 2, t0 + 20s, 5s, "test", abandon), PeerFailure);
  EXPECT_LT(Clock::now() - t0, 10s);
}

TEST(StreamAuth, WrongTokenForeignRankAndDuplicatesAreDroppedNotFatal) {
  net::Fd listener = net::listen_on("127.0.0.1", 0);
  const int port = net::local_port(listener.get());
  StreamAuth a = auth();
  auto deadline = Clock::now() + 10s;
  auto accepted = std::async(std::launch::async, [&] {
    return accept_streams(listener.get(), a, 0, 3, deadline, 2s, "test");
  });
  auto refused = [&](const StreamAuth& who, int rank) {
    try {
      connect_stream("127.0.0.1", port, who, rank, 0, Clock::now() + 3s, "test");
      return false;
    } catch (const IoError&) {
      return true;  // dropped: no answer
    }
  };
  StreamAuth stranger = a;
  stranger.token = net::random_nonce();
  EXPECT_TRUE(refused(stranger, 1));
  StreamAuth no_secret = a;
  no_secret.job_secret = "";
  EXPECT_TRUE(refused(no_secret, 1));
  EXPECT_TRUE(refused(a, 5));  // out of range
  EXPECT_TRUE(refused(a, 0));  // the acceptor's own rank
  Stream real = connect_stream("127.0.0.1", port, a, 1, 0, deadline, "test");
  EXPECT_TRUE(real.fd.valid());
  EXPECT_TRUE(refused(a, 1));  // rank 1 again
  Stream two = connect_stream("127.0.0.1", port, a, 2, 0, deadline, "test");
  auto fds = accepted.get();
  EXPECT_TRUE(fds[1].fd.valid());
  EXPECT_TRUE(fds[2].fd.valid());
}

TEST(StreamAuth, AProofForAnotherRankIsRefused) {
  net::Fd listener = net::listen_on("127.0.0.1", 0);
  const int port = net::local_port(listener.get());
  StreamAuth a = auth();
  auto deadline = Clock::now() + 2s;
  auto accepted = std::async(std::launch::async, [&] {
    return accept_streams(listener.get(), a, 0, 3, deadline, 1s, "test");
  });
  // Claims rank 2 with a proof made for rank 1.
  net::Fd fd = raw_connect(port);
  net::Nonce theirs;
  Status st = net::read_all(fd.get(), theirs.data(), theirs.size(), deadline);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  net::Nonce mine = net::random_nonce();
  net::Proof proof = net::compute_proof(
      a.key(), {net::Direction::kConnector, theirs, mine, a.job_id, Role::kWorker, 1});
  std::byte hello[72] = {};
  hello[0] = std::byte{2};
  std::memcpy(hello + 8, mine.data(), mine.size());
  std::memcpy(hello + 40, proof.data(), proof.size());
  ASSERT_TRUE(net::write_all(fd.get(), hello, sizeof hello, deadline).is_ok());
  char c;
  st = net::read_all(fd.get(), &c, 1, deadline);  // closed, no answer
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.code(), ErrorCode::kTimeout) << st.to_string();  // closed, not left hanging
  try {
    accepted.get();
    ADD_FAILURE() << "no rank connected, yet the accept succeeded";
  } catch (const Timeout& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank(s) 1, 2"));
  }
}

TEST(StreamAuth, ConnectorRefusesAnImpostorListener) {
  net::Fd listener = net::listen_on("127.0.0.1", 0);
  net::set_nonblocking(listener.get(), false);
  const int port = net::local_port(listener.get());
  std::thread impostor([&] {
    net::Fd fd(::accept(listener.get(), nullptr, nullptr));
    auto deadline = Clock::now() + 5s;
    net::Nonce n = net::random_nonce();
    EXPECT_TRUE(net::write_all(fd.get(), n.data(), n.size(), deadline).is_ok());
    std::byte hello[72];
    EXPECT_TRUE(net::read_all(fd.get(), hello, sizeof hello, deadline).is_ok());
    net::Proof reflected;
    std::memcpy(reflected.data(), hello + 40, reflected.size());  // the connector's own proof
    EXPECT_TRUE(net::write_all(fd.get(), reflected.data(), reflected.size(), deadline).is_ok());
    char c;
    (void)net::read_all(fd.get(), &c, 1, deadline);  // until the connector gives up on us
  });
  EXPECT_THROW(connect_stream("127.0.0.1", port, auth(), 1, 0, Clock::now() + 5s, "test"),
               ProtocolError);
  impostor.join();
}

// With TLS (PUSHPULL_TLS) the streams' handshake runs inside TLS 1.3: ranks
// with the secret get working streams (bytes checked both ways), a plain
// connector and one with another secret are dropped without failing the
// accept, and a connector facing a plain listener refuses it.
StreamAuth tls_auth(const std::string& secret = "s3cret") {
  StreamAuth a = auth(secret);
  NetOptions n;
  n.tls = true;
  n.job_id = a.job_id;
  n.job_secret = secret;
  a.tls = net::tls_context(n);
  return a;
}

TEST(StreamAuthTls, MembersGetEncryptedStreamsStrangersAreDropped) {
  net::Fd listener = net::listen_on("127.0.0.1", 0);
  const int port = net::local_port(listener.get());
  StreamAuth a = tls_auth();
  auto deadline = Clock::now() + 10s;
  auto accepted = std::async(std::launch::async, [&] {
    return accept_streams(listener.get(), a, 0, 2, deadline, 2s, "test");
  });
  // Plain TCP with the right token and secret: no TLS, no stream.
  StreamAuth plain = a;
  plain.tls = nullptr;
  EXPECT_THROW(connect_stream("127.0.0.1", port, plain, 1, 0, Clock::now() + 3s, "test"), IoError);
  // TLS with another secret: the TLS handshake itself fails.
  StreamAuth other = tls_auth("another");
  other.token = a.token;
  EXPECT_THROW(connect_stream("127.0.0.1", port, other, 1, 0, Clock::now() + 3s, "test"),
               ProtocolError);
  Stream mine = connect_stream("127.0.0.1", port, a, 1, 0, deadline, "test");
  ASSERT_TRUE(mine.tls);
  auto fds = accepted.get();
  ASSERT_TRUE(fds[1].tls);
  const std::string ping = "ping over tls", pong = "pong";
  Status st = net::tls_write_all(*mine.tls, ping.data(), ping.size(), deadline);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  std::string got(ping.size(), '\0');
  st = net::tls_read_all(*fds[1].tls, got.data(), got.size(), deadline);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(got, ping);
  ASSERT_TRUE(net::tls_write_all(*fds[1].tls, pong.data(), pong.size(), deadline).is_ok());
  std::string back(pong.size(), '\0');
  st = net::tls_read_all(*mine.tls, back.data(), back.size(), deadline);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(back, pong);
}

TEST(StreamAuthTls, AConnectorWithTlsRefusesAPlainListener) {
  net::Fd listener = net::listen_on("127.0.0.1", 0);
  const int port = net::local_port(listener.get());
  StreamAuth a = auth();
  auto accepted = std::async(std::launch::async, [&] {
    try {
      accept_streams(listener.get(), a, 0, 2, Clock::now() + 3s, 2s, "test");
    } catch (const Timeout&) {
    }
  });
  StreamAuth t = tls_auth();
  t.token = a.token;
  EXPECT_THROW(connect_stream("127.0.0.1", port, t, 1, 0, Clock::now() + 3s, "test"),
               ProtocolError);
  accepted.get();
}

Options rv(int rank, int size, int port) {
  Options o;
  o.net.job_id = "rv-auth-" + std::to_string(port);
  o.net.connect_timeout = 5s;
  o.collective.rank = rank;
  o.collective.size = size;
  o.collective.master_addr = "127.0.0.1";
  o.collective.master_port = port;
  return o;
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
    net::TransportConfig tc;
    tc.net = rv(0, 3, port).net;
    tc.role = Role::kWorker;
    tc.rank = identity;
    net::MessageTransport t(tc);
    std::promise<std::string> refused;
    t.set_handler(kStoreReply, kStoreReply, [&](net::Message&& m) {
      EXPECT_NE(m.header.flags, 0u) << "refused with an error code";
      refused.set_value(
          std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size()));
    });
    t.start();
    net::ConnId c = t.connect("127.0.0.1", port, 5s);
    t.send_copy(c, net::Header{.type = type, .request_id = 1}, request.data(), request.size());
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
