// SPDX-License-Identifier: Apache-2.0
// transport::MessageTransport with PUSHPULL_TLS (transport/tls.h): messages of every size both
// ways at once (handlers and posted receives, with and without shared
// memory), and clear refusals between a TLS node and a plain one or one
// with another secret, the acceptor going on serving.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "net/fixture.h"

namespace pushpull::test {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TransportConfig tls_config(Role role, int rank, const std::string& secret = "s3cret") {
  TransportConfig c = config(role, rank, secret);
  c.net.tls = true;
  c.net.handshake_timeout = 1s;
  return c;
}

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 131 + static_cast<size_t>(seed) * 7) & 0xff);
  return v;
}

// (shared memory on, medium).
class TransportTls : public ::testing::TestWithParam<std::tuple<bool, std::string>> {};

class TransportTlsRefusalsOn : public test::Medium {};
INSTANTIATE_TEST_SUITE_P(Media, TransportTlsRefusalsOn, ::testing::ValuesIn(test::kMedia),
                         test::medium_name);

TEST_P(TransportTls, MessagesOfEverySizeArriveInOrderBothWays) {
  auto ca = tls_config(Role::kServer, 0), cb = tls_config(Role::kWorker, 0);
  ca.shared_memory = cb.shared_memory = std::get<0>(GetParam());
  const std::string& host = std::get<1>(GetParam());
  Sink a(ca, host);
  MessageTransport b(cb);
  std::mutex mu;
  std::vector<Message> at_b;
  b.set_handler(kData, kData, [&](Message&& m) {
    std::lock_guard l(mu);
    at_b.push_back(std::move(m));
  });
  b.start();
  ConnId to_a = b.connect(host, a.t.port());
  // The acceptor's connect handler may run just after connect() returned.
  for (int i = 0; i < 1000 && a.npeers() == 0; ++i)
    std::this_thread::sleep_for(5ms);
  ASSERT_EQ(a.npeers(), 1u);
  const ConnId to_b = a.peers[0].first;
  const std::vector<size_t> sizes = {0, 1, 31, 16 << 10, (64 << 10) + 3, 4 << 20, 20 << 20};
  std::vector<std::vector<std::byte>> payloads;
  for (size_t i = 0; i < sizes.size(); ++i)
    payloads.push_back(pattern(sizes[i], static_cast<int>(i)));
  // A posted receive for one more 8 MiB message from a to b.
  auto posted = pattern(8 << 20, 99);
  std::vector<std::byte> into(posted.size());
  std::promise<Status> filled;
  b.post_recv(to_a, RecvMatch{kBlock, 5, 6}, into.data(), into.size(),
              [&](const Status& s, const Header&) { filled.set_value(s); });
  std::atomic<int> sent{0};
  auto done = [&](const Status& s) {
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    ++sent;
  };
  for (size_t i = 0; i < sizes.size(); ++i) {
    b.send(to_a, Header{.type = kData, .key = i}, payloads[i].data(), payloads[i].size(), done);
    a.t.send(to_b, Header{.type = kData, .key = i}, payloads[i].data(), payloads[i].size(), done);
  }
  a.t.send(to_b, Header{.type = kBlock, .request_id = 5, .key = 6}, posted.data(), posted.size(),
           done);
  auto f = filled.get_future();
  ASSERT_EQ(f.wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(f.get().is_ok());
  EXPECT_TRUE(into == posted);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    std::lock_guard l(mu);
    if (at_b.size() == sizes.size() && a.count() == sizes.size()) break;
    std::this_thread::sleep_for(5ms);
  }
  std::lock_guard l(mu);
  std::lock_guard la(a.mu);
  ASSERT_EQ(at_b.size(), sizes.size());
  ASSERT_EQ(a.got.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(at_b[i].header.key, i);
    EXPECT_EQ(a.got[i].header.key, i);
    auto same = [&](const Message& m) {
      return m.payload.size() == sizes[i] &&
             (sizes[i] == 0 || std::memcmp(m.payload.data(), payloads[i].data(), sizes[i]) == 0);
    };
    EXPECT_TRUE(same(at_b[i])) << "message " << i << " to b";
    EXPECT_TRUE(same(a.got[i])) << "message " << i << " to a";
  }
  EXPECT_EQ(sent.load(), static_cast<int>(2 * sizes.size() + 1));
  b.stop();
}

INSTANTIATE_TEST_SUITE_P(SharedMemory, TransportTls,
                         ::testing::Combine(::testing::Bool(), ::testing::ValuesIn(test::kMedia)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "WithShm" : "NoShm") +
                                  (is_in_process_host(std::get<1>(info.param)) ? "_inproc"
                                                                               : "_tcp");
                         });

TEST_P(TransportTlsRefusalsOn, PlainAndTlsNodesRefuseEachOtherAndTheAcceptorGoesOn) {
  // A TLS node dialing a plain one: the TLS handshake meets a challenge.
  Sink plain(config(Role::kServer, 0, "s3cret"), host());
  MessageTransport tls_client(tls_config(Role::kWorker, 0));
  tls_client.start();
  try {
    tls_client.connect(host(), plain.t.port(), 3s);
    ADD_FAILURE() << "a TLS node connected to a plain one";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), HasSubstr("PUSHPULL_TLS"));
  }
  // A plain node dialing a TLS one: no challenge ever comes in clear.
  Sink tls_server(tls_config(Role::kServer, 0), host());
  MessageTransport plain_client(config(Role::kWorker, 1, "s3cret"));
  plain_client.start();
  EXPECT_ANY_THROW(plain_client.connect(host(), tls_server.t.port(), 2s));
  // Another secret: refused by TLS itself.
  MessageTransport other(tls_config(Role::kWorker, 2, "another"));
  other.start();
  try {
    other.connect(host(), tls_server.t.port(), 3s);
    ADD_FAILURE() << "a node with another secret connected";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), HasSubstr("secret"));
  }
  // None of it reached the upper layers; a member still gets in.
  EXPECT_EQ(tls_server.npeers(), 0u);
  EXPECT_EQ(plain.npeers(), 0u);
  MessageTransport member(tls_config(Role::kWorker, 3));
  member.start();
  ConnId c = member.connect(host(), tls_server.t.port(), 3s);
  const char hi[] = "hi";
  member.send_copy(c, Header{.type = kData}, hi, sizeof hi);
  for (int i = 0; i < 500 && tls_server.count() == 0; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(tls_server.count(), 1u);
  member.stop();
  other.stop();
  plain_client.stop();
  tls_client.stop();
}

}  // namespace
}  // namespace pushpull::test
