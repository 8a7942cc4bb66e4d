// SPDX-License-Identifier: Apache-2.0
// The same-host shared-memory path of the MessageTransport (transport/shm/shm_setup.h):
// payloads of every size through small rings, in order with TCP-only
// messages, both directions at once; the opt-out. Peers that die or lie:
// shm_peers_test.cpp; segment names: shm_segment_test.cpp.
#include <gtest/gtest.h>

#include <dirent.h>

#include <thread>

#include "base/metrics.h"
#include "pushpull/options.h"
#include "shm_fixture.h"
#include "support/wait.h"
#include "transport/shm/shm_segment.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::transport {
namespace {

using namespace std::chrono_literals;
using test::pattern;
using test::shm_config;
using test::Sink;
using test::TempShmDir;
using test::wait_until;

using test::kData;
using test::kReply;

int64_t shm_bytes() {
  return metrics::value(metrics::Counter::kNetShmBytes);
}
int64_t tcp_bytes() {
  return metrics::value(metrics::Counter::kNetTcpBytes);
}

// Segments left in `dir` (every one must be unlinked once set up).
size_t leftover_segments(const std::string& dir) {
  size_t n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (ShmSegment::valid_name(e->d_name)) ++n;
    closedir(d);
  }
  return n;
}

TEST(ShmTransport, PayloadsOfEverySizeArriveInOrderThroughTheRing) {
  TempShmDir dir;
  TransportConfig ca = shm_config(Role::kServer, 0), cb = shm_config(Role::kWorker, 1);
  ca.shm_dir = cb.shm_dir = dir.path;
  Sink a(ca);
  MessageTransport b(cb);
  b.start();
  ConnId c = b.connect("127.0.0.1", a.t.port());
  const int64_t shm0 = shm_bytes(), tcp0 = tcp_bytes();
  // Large and small, zero-length and copied, in one order.
  const std::vector<size_t> sizes{1, 0, 100, 64 << 10, (1 << 20) + 3, 7, 5 << 20, 0, 4096, 65537};
  std::vector<std::vector<std::byte>> sent;
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sent.push_back(pattern(sizes[i], static_cast<uint32_t>(i)));
    total += sizes[i];
  }
  std::atomic<int> done{0};
  for (size_t i = 0; i < sizes.size(); ++i) {
    Header h{.type = kData, .request_id = i};
    if (i % 3 == 2) {
      ASSERT_TRUE(b.send_copy(c, h, sent[i].data(), sent[i].size()).is_ok());
      ++done;
    } else {
      b.send(c, h, sent[i].data(), sent[i].size(), [&](const Status& s) {
        EXPECT_TRUE(s.is_ok()) << s.message();
        ++done;
      });
    }
  }
  ASSERT_TRUE(wait_until([&] { return a.count() == sizes.size(); }, 30s));
  ASSERT_TRUE(wait_until([&] { return done.load() == static_cast<int>(sizes.size()); }));
  {
    std::lock_guard l(a.mu);
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_EQ(a.got[i].header.request_id, i);
      ASSERT_EQ(a.got[i].payload.size(), sizes[i]);
      // (memcmp of zero bytes: an empty payload's data() may be null, which
      // memcmp must not be given even for size 0.)
      if (sizes[i] > 0) {
        EXPECT_EQ(0, std::memcmp(a.got[i].payload.data(), sent[i].data(), sizes[i])) << i;
      }
    }
  }
  // Every payload byte went through the ring, none over TCP.
  EXPECT_EQ(shm_bytes() - shm0, static_cast<int64_t>(total));
  EXPECT_EQ(tcp_bytes() - tcp0, 0);
  // Both names are gone from /dev/shm (unlinked once mapped).
  EXPECT_EQ(leftover_segments(dir.path), 0u);
}

TEST(ShmTransport, PostedReceiveAndBothDirectionsAtOnce) {
  Sink a(shm_config(Role::kServer, 0));
  MessageTransport b(shm_config(Role::kWorker, 1));
  b.set_handler(kData, kData, [](Message&&) {});
  b.start();
  ConnId c = b.connect("127.0.0.1", a.t.port());
  ASSERT_TRUE(wait_until([&] { return a.npeers() == 1; }));
  ConnId back = a.peers[0].first;
  // Each side sends 8 x 3 MiB to the other at once through 64 KiB rings:
  // both wait for releases that travel behind their own pieces.
  const size_t n = 3 << 20;
  const int k = 8;
  std::vector<std::vector<std::byte>> from_b, from_a;
  std::vector<std::vector<std::byte>> into_a(k, std::vector<std::byte>(n)),
      into_b(k, std::vector<std::byte>(n));
  std::atomic<int> arrived{0}, sent{0};
  for (int i = 0; i < k; ++i) {
    from_b.push_back(pattern(n, static_cast<uint32_t>(i)));
    from_a.push_back(pattern(n, static_cast<uint32_t>(100 + i)));
    auto got = [&](const Status& s, const Header& h) {
      EXPECT_TRUE(s.is_ok()) << s.message();
      EXPECT_EQ(h.payload_bytes, n);
      ++arrived;
    };
    const auto id = static_cast<uint64_t>(i);
    ASSERT_TRUE(a.t.post_recv(back, {kReply, id, 0}, into_a[i].data(), n, got).is_ok());
    ASSERT_TRUE(b.post_recv(c, {kReply, id, 0}, into_b[i].data(), n, got).is_ok());
  }
  auto on_sent = [&](const Status& s) {
    EXPECT_TRUE(s.is_ok()) << s.message();
    ++sent;
  };
  std::thread ta([&] {
    for (int i = 0; i < k; ++i)
      a.t.send(back, Header{.type = kReply, .request_id = static_cast<uint64_t>(i)},
               from_a[i].data(), n, on_sent);
  });
  for (int i = 0; i < k; ++i)
    b.send(c, Header{.type = kReply, .request_id = static_cast<uint64_t>(i)}, from_b[i].data(), n,
           on_sent);
  ta.join();
  ASSERT_TRUE(wait_until([&] { return arrived.load() == 2 * k && sent.load() == 2 * k; }, 60s));
  for (int i = 0; i < k; ++i) {
    EXPECT_EQ(into_a[i], from_b[i]) << i;
    EXPECT_EQ(into_b[i], from_a[i]) << i;
  }
  EXPECT_EQ(a.count(), 0u);
}

TEST(ShmTransport, OptOutOnEitherSideKeepsEverythingOnTcp) {
  for (bool server_on : {false, true}) {
    Sink a(shm_config(Role::kServer, 0, server_on));
    MessageTransport b(shm_config(Role::kWorker, 1, !server_on));
    b.start();
    ConnId c = b.connect("127.0.0.1", a.t.port());
    const int64_t shm0 = shm_bytes(), tcp0 = tcp_bytes();
    auto big = pattern(1 << 20, 3);
    ASSERT_TRUE(b.send_copy(c, Header{.type = kData}, big.data(), big.size()).is_ok());
    ASSERT_TRUE(wait_until([&] { return a.count() == 1; }));
    std::lock_guard l(a.mu);
    ASSERT_EQ(a.got[0].payload.size(), big.size());
    EXPECT_EQ(0, std::memcmp(a.got[0].payload.data(), big.data(), big.size()));
    EXPECT_EQ(shm_bytes() - shm0, 0);
    EXPECT_EQ(tcp_bytes() - tcp0, static_cast<int64_t>(big.size()));
  }
  // PUSHPULL_PS_SHM=0 is the switch of the cluster's nodes.
  Environment env;
  EXPECT_TRUE(Options::from_env(env).net.ps_shared_memory);
  env.set("PUSHPULL_PS_SHM", "0");
  EXPECT_FALSE(Options::from_env(env).net.ps_shared_memory);
}

}  // namespace
}  // namespace pushpull::transport
