// SPDX-License-Identifier: Apache-2.0
// MessageTransport test fixtures: a config for loopback tests, a Sink that records
// what arrives, and a hand-driven RawClient that speaks the hello byte by
// byte (so tests can replay, reflect or forge it) and then raw frames.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "support/media.h"
#include "transport/hello.h"
#include "transport/message.h"
#include "transport/socket.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::test {

using namespace pushpull::transport;

// Message types of the tests (the free range).
inline constexpr uint16_t kData = 200, kReply = 201, kBlock = 202;

inline TransportConfig config(Role role, int rank, std::string secret = "",
                              std::string job = "job") {
  TransportConfig c;
  c.role = role;
  c.rank = rank;
  c.net.job_id = job;
  c.net.job_secret = secret;
  c.net.connect_timeout = std::chrono::seconds(3);
  c.label = fmt::format("{} {}", role_name(role), rank);
  return c;
}

// A server-side transport that records what arrives.
struct Sink {
  explicit Sink(TransportConfig c, const std::string& host = "127.0.0.1") : t(std::move(c)) {
    t.listen(host, 0);
    t.set_connect_handler([this](ConnId id, const PeerInfo& p) {
      std::lock_guard l(mu);
      peers.emplace_back(id, p);
    });
    t.set_close_handler([this](ConnId, const PeerInfo&, const Status& s) {
      std::lock_guard l(mu);
      closes.push_back(s);
    });
    t.set_handler(kData, kData, [this](Message&& m) {
      std::lock_guard l(mu);
      got.push_back(std::move(m));
    });
    t.start();
  }
  // Stop the I/O thread before the members its handlers use go away.
  ~Sink() { t.stop(); }
  size_t count() {
    std::lock_guard l(mu);
    return got.size();
  }
  size_t npeers() {
    std::lock_guard l(mu);
    return peers.size();
  }
  size_t ncloses() {
    std::lock_guard l(mu);
    return closes.size();
  }
  MessageTransport t;
  std::mutex mu;
  std::vector<Message> got;
  std::vector<std::pair<ConnId, PeerInfo>> peers;
  std::vector<Status> closes;
};

class RawClient {
 public:
  explicit RawClient(int port, const std::string& host = "127.0.0.1") {
    Status st = connect_once(resolve(host, port), std::chrono::seconds(2), &fd_);
    EXPECT_TRUE(st.is_ok() && fd_.valid()) << st.to_string();
  }
  // Reads the acceptor's challenge.
  Challenge challenge() {
    Challenge ch;
    auto p = read_message(msg::kChallenge);
    EXPECT_TRUE(decode(p, &ch).is_ok());
    return ch;
  }
  // Sends `hello` as is.
  void send_hello(const Hello& hello) {
    auto payload = encode(hello);
    write(Header{.type = msg::kHello, .payload_bytes = payload.size()}, payload);
  }
  // A well-formed hello for (role, rank) answering `ch` with `secret`, asking
  // for a connection of `kind` with a proof made for `proof_kind` (the same
  // unless a test forges it).
  static Hello make_hello(const Challenge& ch, const std::string& secret, Role role, int rank,
                          const std::string& job = "job", HelloKind kind = HelloKind::kMessages,
                          std::optional<HelloKind> proof_kind = {}) {
    Hello h{kProtocolVersion, job_tag(job), role, rank, "127.0.0.1", 1, random_nonce(), {}, kind};
    h.proof = compute_proof(secret, {Direction::kConnector, ch.nonce, h.nonce, job, role, rank,
                                     proof_kind.value_or(kind)});
    return h;
  }
  HelloAck ack() {
    HelloAck a;
    auto p = read_message(msg::kHelloAck);
    EXPECT_TRUE(decode(p, &a).is_ok());
    return a;
  }
  // The whole hello as worker 7 (or `role`/`rank`); expects acceptance.
  void hello(const std::string& secret = "", Role role = Role::kWorker, int rank = 7) {
    Challenge ch = challenge();
    send_hello(make_hello(ch, secret, role, rank));
    HelloAck a = ack();
    ASSERT_TRUE(a.accepted) << a.reason;
  }
  std::vector<std::byte> read_message(uint16_t type) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    HeaderBytes hb;
    if (Status st = read_all(fd_.get(), hb.data(), hb.size(), deadline); !st) {
      ADD_FAILURE() << "no message: " << st.to_string();
      return {};
    }
    Header h;
    EXPECT_TRUE(decode_header(hb, kMaxHandshakeBytes, &h).is_ok());
    EXPECT_EQ(h.type, type);
    std::vector<std::byte> p(h.payload_bytes);
    Status st = read_all(fd_.get(), p.data(), p.size(), deadline);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return p;
  }
  void write(const Header& h, std::span<const std::byte> payload) {
    auto hb = encode_header(h);
    raw(hb.data(), hb.size());
    raw(payload.data(), payload.size());
  }
  void raw(const void* p, size_t n) {
    // A node that closed on us is what some tests expect: not checked here.
    (void)write_all(fd_.get(), p, n, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  }
  // True when the node closed the connection (EOF) within the timeout.
  bool closed_by_peer(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    char buf[4096];
    auto deadline = std::chrono::steady_clock::now() + timeout;
    Status st;
    while ((st = read_all(fd_.get(), buf, 1, deadline))) {
    }
    return st.message().find("closed") != std::string::npos ||
           st.message().find("reset") != std::string::npos;
  }
  int fd() const { return fd_.get(); }
  // Goes away without a word (a peer that died).
  void close() { fd_.reset(); }

 private:
  Fd fd_;
};

}  // namespace pushpull::test
