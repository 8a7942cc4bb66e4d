// SPDX-License-Identifier: Apache-2.0
// The failure detector's load and its ring: each rank heartbeats only its
// ring predecessor (a constant number of heartbeats per interval, whatever
// the size of the group), a silent successor is probed before it is
// declared, and every survivor learns the verdict. Ranks are threads on
// loopback; a rank that never starts its detector stands for a SIGSTOPped
// one (its connections stay open, it sends nothing and answers no probe).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tcp_group.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::collective {

using transport::irecv;
using transport::LivenessConfig;
using transport::Request;
using transport::TcpTransport;

namespace {

using namespace std::chrono_literals;
using pushpull::collective::testing::outcome;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

LivenessConfig quick(Millis interval, Millis timeout) {
  LivenessConfig l;
  l.heartbeat_interval = interval;
  l.heartbeat_timeout = timeout;
  l.grace = 500ms;
  return l;
}

void close_all(std::vector<std::unique_ptr<TcpTransport>>& ts) {
  for (auto& t : ts)
    if (t) t->close(Status(ErrorCode::kInternal, "test over"));
}

// The old detector sent size - 1 heartbeats per rank per interval (7 here,
// 11 at 12 ranks); the ring sends one. The bound allows the first beat and
// scheduling slack, and is the same for both sizes.
TEST(RingLiveness, HeartbeatsPerRankPerIntervalDoNotGrowWithTheGroup) {
  for (int n : {8, 12}) {
    auto ts = testing::connect_tcp_group(n);
    const Millis interval = 50ms;
    const auto start = std::chrono::steady_clock::now();
    for (auto& t : ts)
      t->start_liveness(quick(interval, 5000ms));
    std::this_thread::sleep_for(1000ms);
    const auto elapsed =
        std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start);
    const uint64_t intervals = static_cast<uint64_t>(elapsed / interval) + 1;
    for (int r = 0; r < n; ++r) {
      const uint64_t sent = ts[static_cast<size_t>(r)]->heartbeats_sent();
      EXPECT_GE(sent, 1u) << "rank " << r << " of " << n << " sent no heartbeat";
      EXPECT_LE(sent, intervals + 1) << "rank " << r << " of " << n << ": " << sent
                                     << " heartbeats in " << intervals << " intervals";
      EXPECT_FALSE(ts[static_cast<size_t>(r)]->verdict()) << "rank " << r << " of " << n;
    }
    close_all(ts);
  }
}

// Rank 5 of 8 stops: its predecessor (rank 4) finds it silent, probes it
// (directly and through ranks 6 and 3), declares it, and every survivor,
// including those with nothing pending on rank 5, fails naming it.
TEST(RingLiveness, AStoppedRankIsNamedByEverySurvivor) {
  const int n = 8, stopped = 5;
  auto ts = testing::connect_tcp_group(n);
  for (int r = 0; r < n; ++r)
    if (r != stopped) ts[static_cast<size_t>(r)]->start_liveness(quick(100ms, 1000ms));
  std::vector<uint64_t> got(n);
  std::vector<Request> pending;
  for (int r = 0; r < n; ++r)
    if (r != stopped)  // each waits on its ring successor (rank 4 on the stopped one)
      pending.push_back(irecv(*ts[static_cast<size_t>(r)], (r + 1) % n, 7,
                              &got[static_cast<size_t>(r)], sizeof got[0]));
  for (const Request& r : pending) {
    Status st = outcome(r);
    EXPECT_EQ(st.code(), ErrorCode::kPeerFailure) << st.to_string();
    EXPECT_TRUE(contains(st.message(), "rank 5 (host 127.0.0.1:")) << st.message();
    EXPECT_TRUE(contains(st.message(), "no answer to probes")) << st.message();
  }
  close_all(ts);
}

// A successor that stays silent on its link but answers the probe (here: its
// heartbeats are far apart, its detector runs) is not declared.
TEST(RingLiveness, ASilentSuccessorThatAnswersTheProbeIsNotDeclared) {
  const int n = 4;
  auto ts = testing::connect_tcp_group(n);
  for (int r = 0; r < n; ++r) {
    LivenessConfig l = r == 2 ? quick(60000ms, 60000ms) : quick(100ms, 300ms);
    l.probe_window = 1000ms;  // a loaded machine's scheduling delays are no death
    ts[static_cast<size_t>(r)]->start_liveness(l);
  }
  // Rank 1 watches rank 2: silent after its first beat, probed every
  // 300 ms + its answer's delay, answering each time.
  std::this_thread::sleep_for(2000ms);
  for (int r = 0; r < n; ++r)
    EXPECT_FALSE(ts[static_cast<size_t>(r)]->verdict())
        << "rank " << r << ": " << ts[static_cast<size_t>(r)]->verdict()->message();
  close_all(ts);
}

}  // namespace
}  // namespace pushpull::collective
