// SPDX-License-Identifier: Apache-2.0
// MessageTransport's data streams (transport/tcp/message_transport.h, "Streams"): open_stream()
// and take_stream() over the one listening port and the one hello; the
// proofs bind the kind (a message connection's proof cannot open a stream,
// nor the reverse, both ways); who may open one (ranks in range, not this
// node's own identity, once each); an acceptor that is not who the connector
// expected; bytes sent before the ack; TLS streams; deadlines and stop().
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <future>
#include <thread>

#include "fixture.h"
#include "support/wait.h"

namespace pushpull::transport {
namespace {

using namespace std::chrono_literals;
using test::config;
using test::kData;
using test::RawClient;
using test::Sink;

// Every test but the one with a hand-made TCP listener runs over each medium.
class StreamsOn : public test::Medium {};
INSTANTIATE_TEST_SUITE_P(Media, StreamsOn, ::testing::ValuesIn(test::kMedia), test::medium_name);
using test::wait_until;

using clock = std::chrono::steady_clock;

// An acceptor (worker 0) that takes streams from ranks [0, 4).
TransportConfig acceptor_config(const std::string& secret = "s3cret", bool tls = false) {
  auto c = config(Role::kWorker, 0, secret);
  c.stream_ranks = 4;
  c.net.tls = tls;
  c.net.handshake_timeout = 2s;
  return c;
}

TransportConfig connector_config(int rank, const std::string& secret = "s3cret", bool tls = false) {
  auto c = config(Role::kWorker, rank, secret);
  c.net.tls = tls;
  return c;
}

// Writes `out` on `from` and reads as many bytes on `to` (blocking, bounded).
std::string pass(const Stream& from, const Stream& to, const std::string& out) {
  const auto deadline = clock::now() + 5s;
  Status st = from.tls ? tls_write_all(*from.tls, out.data(), out.size(), deadline)
                       : write_all(from.fd.get(), out.data(), out.size(), deadline);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  std::string in(out.size(), '\0');
  st = to.tls ? tls_read_all(*to.tls, in.data(), in.size(), deadline)
              : read_all(to.fd.get(), in.data(), in.size(), deadline);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return in;
}

TEST_P(StreamsOn, OpenedAndTakenOnTheMessagePortBesideAMessageConnection) {
  Sink a(acceptor_config(), host());
  MessageTransport b(connector_config(2));
  b.start();
  ConnId conn = b.connect(host(), a.t.port());
  Stream mine = b.open_stream(host(), a.t.port(), Role::kWorker, 0);
  EXPECT_EQ(mine.peer.role, Role::kWorker);
  EXPECT_EQ(mine.peer.rank, 0);
  EXPECT_TRUE(mine.peer.outgoing);
  Stream theirs;
  Status st = a.t.take_stream(Role::kWorker, 2, clock::now() + 5s, &theirs);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(theirs.peer.rank, 2);
  EXPECT_FALSE(theirs.peer.outgoing);
  EXPECT_FALSE(mine.tls);
  EXPECT_EQ(pass(mine, theirs, "to the acceptor"), "to the acceptor");
  EXPECT_EQ(pass(theirs, mine, "and back"), "and back");
  // The stream is no message connection: only the real one reached the
  // connect handler, and it still carries messages.
  b.send_copy(conn, Header{.type = kData}, "m", 1);
  EXPECT_TRUE(wait_until([&] { return a.count() == 1; }));
  EXPECT_EQ(a.npeers(), 1u);
  EXPECT_EQ(a.t.connections().size(), 1u);
  // Closing the stream closes nothing of the transport.
  theirs.fd.reset();
  char c;
  EXPECT_FALSE(read_all(mine.fd.get(), &c, 1, clock::now() + 5s).is_ok());
  EXPECT_EQ(a.ncloses(), 0u);
}

// The proofs bind the kind: a hello asking for a stream with a proof made
// for a message connection is refused, and the reverse.
TEST_P(StreamsOn, AProofForTheOtherKindIsRefused) {
  Sink a(acceptor_config(), host());
  for (auto kind : {HelloKind::kStream, HelloKind::kMessages}) {
    const auto other = kind == HelloKind::kStream ? HelloKind::kMessages : HelloKind::kStream;
    RawClient r(a.t.port(), host());
    Challenge ch = r.challenge();
    r.send_hello(RawClient::make_hello(ch, "s3cret", Role::kWorker, 1, "job", kind, other));
    HelloAck ack = r.ack();
    EXPECT_FALSE(ack.accepted);
    EXPECT_NE(ack.reason.find("authentication failed"), std::string::npos) << ack.reason;
    EXPECT_TRUE(r.closed_by_peer());
  }
  Stream s;
  EXPECT_EQ(a.t.take_stream(Role::kWorker, 1, clock::now() + 200ms, &s).code(),
            ErrorCode::kTimeout);
  EXPECT_EQ(a.npeers(), 0u);
  // A right proof for a stream works on the same node afterwards.
  RawClient ok(a.t.port(), host());
  Challenge ch = ok.challenge();
  ok.send_hello(RawClient::make_hello(ch, "s3cret", Role::kWorker, 1, "job", HelloKind::kStream));
  HelloAck ack = ok.ack();
  ASSERT_TRUE(ack.accepted) << ack.reason;
  ASSERT_TRUE(a.t.take_stream(Role::kWorker, 1, clock::now() + 5s, &s).is_ok());
  EXPECT_EQ(a.npeers(), 0u);  // never a message connection
}

TEST_P(StreamsOn, OnlyRanksInRangeOnceEachAndNotThisNodesOwn) {
  Sink a(acceptor_config(), host());
  auto refused = [&](int rank, const std::string& why) {
    MessageTransport b(connector_config(rank));
    b.start();
    try {
      b.open_stream(host(), a.t.port(), Role::kWorker, 0, 3s);
      ADD_FAILURE() << "rank " << rank << " opened a stream";
    } catch (const ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(4, "may not open a data stream");  // out of range
  refused(0, "own identity");
  MessageTransport one(connector_config(1));
  one.start();
  Stream first = one.open_stream(host(), a.t.port(), Role::kWorker, 0);
  refused(1, "already opened a data stream");
  // A node that takes no streams says so.
  Sink none(config(Role::kWorker, 0, "s3cret"), host());
  try {
    one.open_stream(host(), none.t.port(), Role::kWorker, 0, 3s);
    ADD_FAILURE() << "a node without stream_ranks took a stream";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("takes no data streams"), std::string::npos) << e.what();
  }
  // None of it failed the acceptor: rank 1's stream works, rank 3 opens one.
  Stream taken;
  ASSERT_TRUE(a.t.take_stream(Role::kWorker, 1, clock::now() + 5s, &taken).is_ok());
  EXPECT_EQ(pass(first, taken, "still fine"), "still fine");
  MessageTransport three(connector_config(3));
  three.start();
  Stream s3 = three.open_stream(host(), a.t.port(), Role::kWorker, 0);
  EXPECT_TRUE(a.t.take_stream(Role::kWorker, 3, clock::now() + 5s, &taken).is_ok());
  EXPECT_EQ(a.ncloses(), 0u);
}

// The connector names who it expects: another node at that address (a
// stale book) gets no stream, though its proof is right.
TEST_P(StreamsOn, TheConnectorRefusesAnAcceptorThatIsSomeoneElse) {
  Sink a(acceptor_config(), host());
  MessageTransport b(connector_config(2));
  b.start();
  try {
    b.open_stream(host(), a.t.port(), Role::kWorker, 1, 3s);
    ADD_FAILURE() << "opened a stream to the wrong rank";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("not worker 1"), std::string::npos) << e.what();
  }
}

// An acceptor on a raw socket that accepts whatever hello comes, with an ack
// whose proof is right for worker 0 and the kind `proof_kind`.
void fake_acceptor(Fd& listener, HelloKind proof_kind) {
  Fd fd(::accept(listener.get(), nullptr, nullptr));
  if (!fd.valid()) return;
  const auto deadline = clock::now() + 5s;
  auto send = [&](uint16_t type, const std::vector<std::byte>& payload) {
    auto hb = encode_header(Header{.type = type, .payload_bytes = payload.size()});
    if (write_all(fd.get(), hb.data(), hb.size(), deadline))
      (void)write_all(fd.get(), payload.data(), payload.size(), deadline);
  };
  Challenge ch{kProtocolVersion, job_tag("job"), random_nonce()};
  send(msg::kChallenge, encode(ch));
  HeaderBytes hb;
  Header h;
  if (!read_all(fd.get(), hb.data(), hb.size(), deadline)) return;
  if (!decode_header(hb, kMaxHandshakeBytes, &h)) return;
  std::vector<std::byte> p(h.payload_bytes);
  Hello hello;
  if (!read_all(fd.get(), p.data(), p.size(), deadline) || !decode(p, &hello)) return;
  EXPECT_EQ(hello.kind, HelloKind::kStream);
  HelloAck ack{true, "", Role::kWorker, 0, {}};
  ack.proof = compute_proof(
      "s3cret", {Direction::kAcceptor, ch.nonce, hello.nonce, "job", Role::kWorker, 0, proof_kind});
  send(msg::kHelloAck, encode(ack));
  char c;
  (void)read_all(fd.get(), &c, 1, deadline);  // until the connector hangs up
}

// The acceptor's proof binds the kind too: an ack proven for a message
// connection does not open a stream (the same acceptor proving the stream
// kind does).
TEST(Streams, TheConnectorChecksTheAcceptorsProofForTheStreamKind) {
  for (auto kind : {HelloKind::kMessages, HelloKind::kStream}) {
    Fd listener = listen_on("127.0.0.1", 0);
    set_nonblocking(listener.get(), false);
    const int port = local_port(listener.get());
    std::thread acceptor([&] { fake_acceptor(listener, kind); });
    MessageTransport b(connector_config(1));
    b.start();
    if (kind == HelloKind::kMessages) {
      try {
        b.open_stream("127.0.0.1", port, Role::kWorker, 0, 3s);
        ADD_FAILURE() << "a message connection's ack opened a stream";
      } catch (const ProtocolError& e) {
        EXPECT_NE(std::string(e.what()).find("authentication failed"), std::string::npos)
            << e.what();
      }
    } else {
      Stream s = b.open_stream("127.0.0.1", port, Role::kWorker, 0, 3s);
      EXPECT_TRUE(s.fd.valid());
    }
    acceptor.join();
  }
}

// A connector must wait for the ack: bytes behind its hello close the
// connection instead of reaching the owner as stream data.
TEST_P(StreamsOn, BytesBeforeTheAckCloseTheConnection) {
  Sink a(acceptor_config(), host());
  RawClient r(a.t.port(), host());
  Challenge ch = r.challenge();
  auto hello =
      encode(RawClient::make_hello(ch, "s3cret", Role::kWorker, 2, "job", HelloKind::kStream));
  auto hb = encode_header(Header{.type = msg::kHello, .payload_bytes = hello.size()});
  std::vector<std::byte> all(hb.begin(), hb.end());
  all.insert(all.end(), hello.begin(), hello.end());
  all.resize(all.size() + 16, std::byte{7});  // too early, in the same segment
  r.raw(all.data(), all.size());
  EXPECT_TRUE(r.closed_by_peer());
  Stream s;
  EXPECT_EQ(a.t.take_stream(Role::kWorker, 2, clock::now() + 300ms, &s).code(),
            ErrorCode::kTimeout);
  // Its identity is free again for an honest retry.
  MessageTransport b(connector_config(2));
  b.start();
  Stream mine = b.open_stream(host(), a.t.port(), Role::kWorker, 0);
  EXPECT_TRUE(a.t.take_stream(Role::kWorker, 2, clock::now() + 5s, &s).is_ok());
}

TEST_P(StreamsOn, TlsStreamsWorkAndAPlainConnectorIsRefused) {
  Sink a(acceptor_config("s3cret", true), host());
  MessageTransport plain(connector_config(1));
  plain.start();
  EXPECT_THROW(plain.open_stream(host(), a.t.port(), Role::kWorker, 0, 1s), Error);
  MessageTransport other(connector_config(1, "another", true));
  other.start();
  EXPECT_THROW(other.open_stream(host(), a.t.port(), Role::kWorker, 0, 2s), ProtocolError);
  MessageTransport b(connector_config(1, "s3cret", true));
  b.start();
  Stream mine = b.open_stream(host(), a.t.port(), Role::kWorker, 0);
  Stream theirs;
  ASSERT_TRUE(a.t.take_stream(Role::kWorker, 1, clock::now() + 5s, &theirs).is_ok());
  ASSERT_TRUE(mine.tls);
  ASSERT_TRUE(theirs.tls);
  EXPECT_EQ(pass(mine, theirs, "ping over tls"), "ping over tls");
  EXPECT_EQ(pass(theirs, mine, "pong"), "pong");
}

// Without a secret (PUSHPULL_ALLOW_INSECURE unset) the hello's local-only
// rule is the streams' too: this machine's peers get them.
TEST_P(StreamsOn, WithoutASecretStreamsWorkOnThisMachine) {
  Sink a(acceptor_config(""), host());
  MessageTransport b(connector_config(3, ""));
  b.start();
  Stream mine = b.open_stream(host(), a.t.port(), Role::kWorker, 0);
  Stream theirs;
  ASSERT_TRUE(a.t.take_stream(Role::kWorker, 3, clock::now() + 5s, &theirs).is_ok());
  EXPECT_EQ(pass(mine, theirs, "local"), "local");
}

TEST_P(StreamsOn, TakeStreamEndsAtItsDeadlineAndAtStop) {
  MessageTransport a(acceptor_config());
  a.listen(host(), 0);
  a.start();
  Stream s;
  const auto t0 = clock::now();
  Status st = a.take_stream(Role::kWorker, 1, t0 + 200ms, &s);
  EXPECT_EQ(st.code(), ErrorCode::kTimeout);
  EXPECT_NE(st.message().find("worker 1"), std::string::npos) << st.message();
  EXPECT_GE(clock::now() - t0, 200ms);
  auto waiting = std::async(
      std::launch::async, [&] { return a.take_stream(Role::kWorker, 1, clock::now() + 20s, &s); });
  std::this_thread::sleep_for(100ms);
  a.stop();
  ASSERT_EQ(waiting.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(waiting.get().code(), ErrorCode::kIoError);
}

}  // namespace
}  // namespace pushpull::transport
