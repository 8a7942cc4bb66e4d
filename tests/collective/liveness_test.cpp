// SPDX-License-Identifier: Apache-2.0
// Failure detection: the clock-driven pieces (no sleeping, a manual clock),
// the coordinator's stall timers (explicit times), and the TcpTransport's
// detector with ranks as threads on loopback (a silent rank stands for a
// SIGSTOPped one: its connections stay open and nothing arrives).
#include <gtest/gtest.h>

#include <thread>

#include "base/clock.h"
#include "base/liveness.h"
#include "collective/coordinator.h"
#include "pushpull/collective.h"
#include "tcp_group.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::collective {

using transport::Clock;
using transport::irecv;
using transport::isend;
using transport::LivenessConfig;
using transport::Request;
using transport::TcpTransport;

namespace {

using namespace std::chrono_literals;
using pushpull::collective::testing::outcome;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- SilenceDetector and Verdict, on a manual clock -----------------------

TEST(SilenceDetector, DeclaresAMemberExactlyAfterTheTimeout) {
  ManualClock clock;
  SilenceDetector<int> d(clock, 1000ms);
  d.heard(1);
  d.heard(2);
  clock.advance(1000ms);
  EXPECT_FALSE(d.first_expired()) << "silent for exactly the timeout is still alive";
  clock.advance(1ms);
  auto e = d.first_expired();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->second, 1001ms);
  EXPECT_EQ(d.silence(2), 1001ms);
}

TEST(SilenceDetector, HeartbeatsResetTheTimer) {
  ManualClock clock;
  SilenceDetector<int> d(clock, 1000ms);
  d.heard(1);
  d.heard(2);
  for (int i = 0; i < 10; ++i) {
    clock.advance(600ms);
    d.heard(1);
    d.heard(2);
    EXPECT_FALSE(d.first_expired());
  }
  clock.advance(600ms);
  d.heard(1);  // 2 stays quiet
  clock.advance(600ms);
  auto e = d.first_expired();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->first, 2);
  EXPECT_EQ(e->second, 1200ms);
}

TEST(SilenceDetector, TheLongestSilentGoesFirstAndForgottenOnesNever) {
  ManualClock clock;
  SilenceDetector<int> d(clock, 100ms);
  d.heard(3);
  clock.advance(50ms);
  d.heard(1);
  d.heard(2);
  clock.advance(500ms);
  EXPECT_EQ(d.first_expired()->first, 3);
  d.forget(3);
  EXPECT_EQ(d.first_expired()->first, 1);
  EXPECT_EQ(d.next_deadline(), clock.now() - 500ms + 100ms + 1ms);
  d.forget(1);
  d.forget(2);
  EXPECT_FALSE(d.first_expired());
  EXPECT_EQ(d.next_deadline(), ClockSource::time_point::max());
}

TEST(Verdict, ASuspectIsBlamedOnlyAfterItsGrace) {
  ManualClock clock;
  Verdict v(clock);
  v.suspect(Status(ErrorCode::kPeerFailure, "rank 1 lost"), 1000ms);
  clock.advance(999ms);
  EXPECT_FALSE(v.suspect_due());
  clock.advance(1ms);
  ASSERT_TRUE(v.suspect_due());
  EXPECT_EQ(v.suspect_due()->message(), "rank 1 lost");
  EXPECT_FALSE(v.failure()) << "the owner decides";
}

TEST(Verdict, ABetterCauseWithinTheGraceWinsAndTheFirstDecisionStays) {
  ManualClock clock;
  Verdict v(clock);
  v.suspect(Status(ErrorCode::kPeerFailure, "rank 1 lost"), 1000ms);
  v.suspect(Status(ErrorCode::kPeerFailure, "rank 3 lost"), 10ms);  // the first suspect stays
  clock.advance(500ms);
  EXPECT_TRUE(v.decide(Status(ErrorCode::kPeerFailure, "rank 2 stopped")));
  EXPECT_FALSE(v.decide(Status(ErrorCode::kPeerFailure, "rank 1 lost")));
  clock.advance(5000ms);
  EXPECT_FALSE(v.suspect_due());
  EXPECT_EQ(v.failure()->message(), "rank 2 stopped");
}

// ---- stall inspection (rank 0's coordinator), at explicit times -----------

Spec spec(const std::string& name) {
  Spec s;
  s.name = name;
  s.shape = Shape{4};
  return s;
}

TEST(Stall, AWarningNamesTheMissingRanksAndRepeats) {
  CollectiveOptions o;
  o.stall_warning_seconds = 60;
  ResponseCache cache;
  Coordinator c(3, o, cache);
  auto t0 = Clock::time_point{} + 1h;
  c.submit(0, spec("w"), t0);
  std::vector<StallReport> stalls;
  c.poll(t0 + 59s, &stalls);
  EXPECT_TRUE(stalls.empty());
  auto rs = c.poll(t0 + 60s, &stalls);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].tensor, "w");
  EXPECT_EQ(stalls[0].missing_ranks, (std::vector<int>{1, 2}));
  EXPECT_TRUE(rs.empty()) << "a warning only";
  stalls.clear();
  c.poll(t0 + 61s, &stalls);
  EXPECT_TRUE(stalls.empty());
  c.poll(t0 + 120s, &stalls);
  EXPECT_EQ(stalls.size(), 1u);
  c.poll(t0 + 3600s, &stalls);  // never fails without a shutdown setting
  c.submit(1, spec("w"), t0 + 3601s);
  c.submit(2, spec("w"), t0 + 3601s);
  rs = c.poll(t0 + 3601s, &stalls);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, Response::Kind::kExecute);
}

TEST(Stall, ShutdownFailsTheTensorNamingTheStalledRanks) {
  CollectiveOptions o;
  o.stall_warning_seconds = 10;
  o.stall_shutdown_seconds = 30;
  ResponseCache cache;
  Coordinator c(4, o, cache);
  auto t0 = Clock::time_point{} + 1h;
  c.submit(0, spec("s"), t0);
  c.submit(2, spec("s"), t0 + 1s);
  std::vector<StallReport> stalls;
  EXPECT_TRUE(c.poll(t0 + 29s, &stalls).empty());
  EXPECT_EQ(c.next_deadline(t0 + 29s), t0 + 30s);
  auto rs = c.poll(t0 + 30s, &stalls);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, Response::Kind::kError);
  EXPECT_EQ(rs[0].code, ErrorCode::kTimeout);
  EXPECT_TRUE(contains(rs[0].message, "ranks [1, 3]")) << rs[0].message;
  EXPECT_TRUE(contains(rs[0].message, "PUSHPULL_STALL_SHUTDOWN_SECONDS")) << rs[0].message;
}

// ---- the TcpTransport's detector, ranks as threads ------------------------

std::vector<std::unique_ptr<TcpTransport>> connect_group(int n) {
  return testing::connect_tcp_group(n);
}

LivenessConfig fast(bool detect = true) {
  LivenessConfig l;
  l.detect = detect;
  l.heartbeat_interval = 100ms;
  l.heartbeat_timeout = 1000ms;
  l.grace = 500ms;
  return l;
}

TEST(MeshDetector, ASilentRankFailsEveryonesPendingOperationsNamingIt) {
  auto ts = connect_group(3);
  // Rank 2 never heartbeats nor answers probes (as if stopped); its watcher
  // is its ring predecessor, rank 1. Rank 0 does not detect by itself: it
  // must learn the verdict from rank 1 (and helps probe rank 2 for it).
  ts[0]->start_liveness(fast(false));
  ts[1]->start_liveness(fast());
  uint64_t a = 0, b = 0, c = 0;
  Request r0 = irecv(*ts[0], 1, 7, &a, sizeof a);
  Request r1 = irecv(*ts[1], 0, 7, &b, sizeof b);
  Request r1b = irecv(*ts[1], 2, 8, &c, sizeof c);
  for (const Request* r : {&r0, &r1, &r1b}) {
    Status st = outcome(*r);
    EXPECT_EQ(st.code(), ErrorCode::kPeerFailure) << st.to_string();
    EXPECT_TRUE(contains(st.message(), "rank 2 (host 127.0.0.1:")) << st.message();
    EXPECT_TRUE(contains(st.message(), "no heartbeat for")) << st.message();
  }
  // Later operations fail with the same verdict at once.
  Status later = outcome(isend(*ts[1], 0, 9, &a, sizeof a));
  EXPECT_TRUE(contains(later.message(), "rank 2")) << later.message();
  EXPECT_TRUE(ts[1]->is_closed());
  for (auto& t : ts)
    t->close(Status(ErrorCode::kInternal, "test over"));
}

TEST(MeshDetector, HeartbeatsKeepAnIdleGroupAlive) {
  ManualClock clock;
  auto ts = connect_group(2);
  LivenessConfig l = fast();
  l.clock = &clock;
  for (auto& t : ts)
    t->start_liveness(l);
  // Real time passes (3 timeouts' worth of heartbeats); nobody is declared.
  for (int i = 0; i < 30; ++i) {
    clock.advance(100ms);
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_FALSE(ts[0]->verdict());
  EXPECT_FALSE(ts[1]->verdict());
  for (auto& t : ts)
    t->close(Status(ErrorCode::kInternal, "test over"));
}

TEST(MeshDetector, AVerdictIsPassedOnAndTheMessengerIsNotBlamed) {
  auto ts = connect_group(3);
  for (auto& t : ts)
    t->start_liveness(fast(false));
  uint64_t a = 0;
  Request r0 = irecv(*ts[0], 1, 7, &a, sizeof a);
  // Rank 1 learns (say, from the scheduler) that rank 2 died, then fails
  // and closes: rank 0 must blame rank 2, not rank 1.
  ts[1]->declare(Status(ErrorCode::kPeerFailure, "worker 2 (host h:1) failed: killed"));
  ts[1]->abort(Status(ErrorCode::kPeerFailure, "worker 2 (host h:1) failed: killed"));
  Status st = outcome(r0);
  EXPECT_EQ(st.code(), ErrorCode::kPeerFailure);
  EXPECT_EQ(st.message(), "worker 2 (host h:1) failed: killed");
  for (auto& t : ts)
    t->close(Status(ErrorCode::kInternal, "test over"));
}

TEST(MeshDetector, ARankFailingByItselfIsNamedWithItsCause) {
  auto ts = connect_group(2);
  for (auto& t : ts)
    t->start_liveness(fast(false));
  uint64_t a = 0;
  Request r0 = irecv(*ts[0], 1, 7, &a, sizeof a);
  ts[1]->abort(Status(ErrorCode::kProtocolError, "bad control message"));
  Status st = outcome(r0);
  EXPECT_EQ(st.code(), ErrorCode::kPeerFailure);
  EXPECT_TRUE(contains(st.message(), "rank 1 (host 127.0.0.1:")) << st.message();
  EXPECT_TRUE(contains(st.message(), "bad control message")) << st.message();
  ts[0]->close(Status(ErrorCode::kInternal, "test over"));
}

TEST(MeshDetector, AnOrderlyCloseIsNotAFailureButFailsWhatWaitsOnIt) {
  auto ts = connect_group(2);
  for (auto& t : ts)
    t->start_liveness(fast());
  ts[1]->close(Status(ErrorCode::kInternal, "done"));
  uint64_t a = 0;
  Status st = outcome(irecv(*ts[0], 1, 7, &a, sizeof a));
  EXPECT_EQ(st.code(), ErrorCode::kPeerFailure);
  EXPECT_TRUE(contains(st.message(), "has shut down its communicator")) << st.message();
  EXPECT_FALSE(ts[0]->verdict()) << "no failure was decided";
  ts[0]->close(Status(ErrorCode::kInternal, "test over"));
}

TEST(MeshDetector, UnaskedForMessagesAreCappedPerPeer) {
  auto ts = connect_group(2);
  LivenessConfig l = fast(false);
  l.early_messages = 3;
  ts[0]->start_liveness(l);
  ts[1]->start_liveness(fast(false));
  uint64_t v = 1;
  for (uint64_t tag = 100; tag < 110; ++tag)
    ts[1]->post_send(0, tag, &v, sizeof v, [](const Status&) {});
  uint64_t a = 0;
  Status st = outcome(irecv(*ts[0], 1, 7, &a, sizeof a));
  EXPECT_EQ(st.code(), ErrorCode::kPeerFailure);
  EXPECT_TRUE(contains(st.message(), "rank 1")) << st.message();
  EXPECT_TRUE(contains(st.message(), "no receive asked for")) << st.message();
  for (auto& t : ts)
    t->close(Status(ErrorCode::kInternal, "test over"));
}

// The engine on top: ranks 0 and 1 allreduce, rank 2 never submits and never
// heartbeats (stopped). Both pending allreduces fail naming rank 2.
TEST(MeshDetector, PendingAllreducesFailWhenAMemberStops) {
  auto ts = connect_group(3);
  ts[0]->start_liveness(fast());
  ts[1]->start_liveness(fast());
  CommunicatorOptions o;
  o.wait_timeout = 20s;
  std::vector<std::unique_ptr<Communicator>> cs;
  for (auto& t : ts)
    cs.push_back(std::make_unique<Communicator>(std::move(t), o));
  std::vector<std::thread> th;
  std::vector<Status> got(2);
  for (int r = 0; r < 2; ++r)
    th.emplace_back([&, r] {
      Array x = Array::full(Shape{16}, 1.0);
      try {
        cs[static_cast<size_t>(r)]->allreduce("x", x);
      } catch (const Error& e) {
        got[static_cast<size_t>(r)] = Status(e.code(), e.what());
      }
    });
  for (auto& t : th)
    t.join();
  for (const Status& st : got) {
    EXPECT_EQ(st.code(), ErrorCode::kPeerFailure) << st.to_string();
    EXPECT_TRUE(contains(st.message(), "rank 2 (host 127.0.0.1:")) << st.message();
  }
  cs.clear();  // every engine and transport stops cleanly, rank 2's too
}

}  // namespace
}  // namespace pushpull::collective
