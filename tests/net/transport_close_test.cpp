// SPDX-License-Identifier: Apache-2.0
// MessageTransport: how a connection closes when a send fails (what the
// peer sent last is delivered first).
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "fixture.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::transport {
namespace {

using namespace std::chrono_literals;
using test::config;
using test::kBlock;
using test::kData;
using test::RawClient;

class MessageTransportClosing : public test::Medium {};
INSTANTIATE_TEST_SUITE_P(Media, MessageTransportClosing, ::testing::ValuesIn(test::kMedia),
                         test::medium_name);

// A peer that sends its last word (a verdict, in the cluster) and closes:
// when this node's next send fails (EPIPE) before it read that word, the word
// is still delivered before the connection closes, so the node blames whom
// the peer named rather than the peer. The I/O thread is held in another
// connection's handler while the peer speaks and goes, and a send fails, so
// the failed write and the unread message reach it in one readiness event.
TEST_P(MessageTransportClosing, ASendFailureFirstDeliversWhatThePeerSentLast) {
  // Declared before the transport, whose I/O thread uses them until it stops.
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, release = false;
  std::vector<std::string> got;
  std::vector<ConnId> peers;
  MessageTransport a(config(Role::kServer, 0));
  a.listen(host(), 0);
  a.set_connect_handler([&](ConnId id, const PeerInfo&) {
    std::lock_guard l(mu);
    peers.push_back(id);
    cv.notify_all();
  });
  a.set_handler(kData, kData, [&](Message&& m) {
    std::lock_guard l(mu);
    got.emplace_back(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
  });
  a.set_handler(kBlock, kBlock, [&](Message&&) {
    std::unique_lock l(mu);
    entered = true;
    cv.notify_all();
    cv.wait_for(l, 10s, [&] { return release; });
  });
  a.start();
  auto leaving = std::make_unique<RawClient>(a.port(), host());
  leaving->hello("", Role::kWorker, 1);
  RawClient holder(a.port(), host());
  holder.hello("", Role::kWorker, 2);
  ConnId to_leaving{};
  {
    std::unique_lock l(mu);
    ASSERT_TRUE(cv.wait_for(l, 5s, [&] { return peers.size() == 2; }));
    to_leaving = peers[0];
  }
  holder.write(Header{.type = kBlock}, {});
  {
    std::unique_lock l(mu);
    ASSERT_TRUE(cv.wait_for(l, 5s, [&] { return entered; }));
  }
  const std::string last = "worker 9 failed";
  leaving->write(Header{.type = kData, .payload_bytes = last.size()},
                 std::as_bytes(std::span(last.data(), last.size())));
  leaving.reset();  // closed: its kernel answers the next bytes with a reset
  // Sends until one fails on this thread (the reset has come back): that one
  // stays queued for the I/O thread, which finds the error and the message.
  std::promise<Status> failed;
  std::atomic<bool> told{false};
  bool queued = false;
  for (int i = 0; i < 100 && !queued; ++i) {
    std::this_thread::sleep_for(20ms);
    auto done = std::make_shared<std::atomic<bool>>(false);
    a.send(to_leaving, Header{.type = kData}, "x", 1, [&, done](const Status& st) {
      done->store(true);
      if (!st.is_ok() && !told.exchange(true)) failed.set_value(st);
    });
    queued = !done->load();
  }
  ASSERT_TRUE(queued) << "no send failed while the I/O thread was held";
  {
    std::lock_guard l(mu);
    release = true;
    cv.notify_all();
  }
  auto f = failed.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  a.stop();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], last);
}

}  // namespace
}  // namespace pushpull::transport
