// SPDX-License-Identifier: Apache-2.0
// The shared failure detector (transport/liveness.h) on a manual clock, for
// both its decisions and its beats: no sleeping, no threads. Each test reads
// the events poll() hands out at chosen instants, decisions exactly at their
// deadlines included.
#include <gtest/gtest.h>

#include <vector>

#include "base/clock.h"
#include "transport/liveness.h"

namespace pushpull::transport {
namespace {

using namespace std::chrono_literals;
using Event = Liveness::Event;

Status lost(const std::string& who) {
  return Status(ErrorCode::kPeerFailure, who + " lost");
}

// Every event due now (the detector consumes each).
std::vector<Event> drain(Liveness& d) {
  std::vector<Event> out;
  for (Event e = d.poll(); e.kind != Event::kNone; e = d.poll()) {
    out.push_back(e);
    if (e.kind == Event::kSuspectDue) break;  // due until the owner decides it
  }
  return out;
}

std::vector<Event::Kind> kinds(const std::vector<Event>& events) {
  std::vector<Event::Kind> out;
  for (const Event& e : events)
    out.push_back(e.kind);
  return out;
}

TEST(Detector, BeatsComeOncePerIntervalFromTheStart) {
  ManualClock clock;
  Liveness d({100ms, 1000ms, 0ms}, clock, clock);
  EXPECT_EQ(kinds(drain(d)), std::vector{Event::kBeat}) << "the first beat is due at once";
  EXPECT_EQ(d.until_next(), 100ms);
  clock.advance(99ms);
  EXPECT_TRUE(drain(d).empty());
  EXPECT_EQ(d.until_next(), 1ms);
  clock.advance(1ms);
  EXPECT_EQ(kinds(drain(d)), std::vector{Event::kBeat});
}

TEST(Detector, ASilentMemberIsDeadExactlyAfterTheTimeoutAndOnlyOnce) {
  ManualClock clock;
  Liveness d({10s, 1000ms, 0ms}, clock, clock);
  drain(d);  // the first beat
  d.heard(7);
  d.heard(8);
  EXPECT_EQ(d.until_next(), 1001ms) << "wakes when the silence passes the limit";
  clock.advance(600ms);
  d.heard(8);  // 8 speaks; 7 stays quiet
  clock.advance(400ms);
  EXPECT_TRUE(drain(d).empty()) << "silent for exactly the timeout is still alive";
  clock.advance(1ms);
  auto events = drain(d);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Event::kDead);
  EXPECT_EQ(events[0].member, 7u);
  EXPECT_EQ(events[0].silence, 1001ms);
  EXPECT_FALSE(d.watching(7)) << "a dead member is forgotten";
  EXPECT_TRUE(d.watching(8));
  EXPECT_EQ(d.until_next(), 600ms);  // 8's limit: heard 1001 ms after 7, 1 ms past it
  clock.advance(600ms);
  events = drain(d);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].member, 8u);
  EXPECT_TRUE(drain(d).empty());
}

TEST(Detector, ASilentMemberIsProbedThenDeadWhenItDoesNotAnswer) {
  ManualClock clock;
  Liveness d({10s, 1000ms, 300ms}, clock, clock);
  drain(d);
  d.heard(2);
  clock.advance(1001ms);
  auto events = drain(d);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Event::kProbe);
  EXPECT_EQ(events[0].member, 2u);
  EXPECT_EQ(events[0].silence, 1001ms);
  EXPECT_TRUE(drain(d).empty()) << "probed once per silence";
  EXPECT_EQ(d.until_next(), 300ms);
  clock.advance(299ms);
  EXPECT_TRUE(drain(d).empty()) << "still within its probe window";
  clock.advance(1ms);
  events = drain(d);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Event::kDead);
  EXPECT_EQ(events[0].member, 2u);
  EXPECT_EQ(events[0].silence, 1301ms) << "its whole silence, probe window included";
  EXPECT_FALSE(d.watching(2));
}

TEST(Detector, AnAnswerToTheProbeKeepsTheMemberAlive) {
  ManualClock clock;
  Liveness d({10s, 1000ms, 300ms}, clock, clock);
  drain(d);
  d.heard(2);
  clock.advance(1001ms);
  ASSERT_EQ(kinds(drain(d)), std::vector{Event::kProbe});
  clock.advance(200ms);
  d.heard(2);  // the ack (direct or relayed)
  clock.advance(500ms);
  EXPECT_TRUE(drain(d).empty()) << "the probe ended with the answer";
  EXPECT_EQ(d.silence(2), 500ms);
  clock.advance(501ms);  // silent past the timeout again: probed again, not dead
  EXPECT_EQ(kinds(drain(d)), std::vector{Event::kProbe});
}

TEST(Detector, ASuspectIsDueExactlyAtTheEndOfItsGrace) {
  ManualClock clock;
  Liveness d({10s, 1000ms, 0ms}, clock, clock);
  drain(d);
  d.verdict().suspect(lost("rank 1"), 500ms);
  EXPECT_EQ(d.until_next(), 500ms);
  clock.advance(499ms);
  EXPECT_TRUE(drain(d).empty());
  clock.advance(1ms);
  auto events = drain(d);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Event::kSuspectDue);
  EXPECT_EQ(events[0].why.message(), "rank 1 lost");
  EXPECT_EQ(d.until_next(), 0ms) << "due until the owner decides it";
  EXPECT_TRUE(d.verdict().decide(events[0].why));
  EXPECT_TRUE(drain(d).empty());
  EXPECT_EQ(d.verdict().failure()->message(), "rank 1 lost");
}

TEST(Detector, AVerdictWithinTheGraceSupersedesTheSuspect) {
  ManualClock clock;
  Liveness d({10s, 1000ms, 0ms}, clock, clock);
  drain(d);
  d.verdict().suspect(lost("rank 1"), 500ms);
  clock.advance(300ms);
  EXPECT_TRUE(d.verdict().decide(lost("rank 2")));  // the right culprit, from a peer
  clock.advance(5s);
  EXPECT_TRUE(drain(d).empty()) << "the suspect is never due";
  EXPECT_EQ(d.until_next(), 4700ms) << "only the next beat wakes it";
  EXPECT_EQ(d.verdict().failure()->message(), "rank 2 lost");
}

TEST(Detector, OnceFailedSilenceDecidesNothingButBeatsGoOn) {
  ManualClock clock;
  Liveness d({100ms, 1000ms, 300ms}, clock, clock);
  drain(d);
  d.heard(4);
  EXPECT_TRUE(d.verdict().decide(lost("rank 9")));
  clock.advance(2s);
  EXPECT_EQ(kinds(drain(d)), std::vector{Event::kBeat});
  EXPECT_EQ(d.until_next(), 100ms) << "no silence deadline wakes it any more";
  EXPECT_TRUE(d.watching(4));
}

TEST(Detector, BeatsAndDecisionsFollowTheirOwnClocks) {
  ManualClock decisions, beats;
  Liveness d({100ms, 1000ms, 0ms}, decisions, beats);
  drain(d);
  d.heard(1);
  decisions.advance(2s);  // a stalled test clock for decisions ...
  EXPECT_EQ(kinds(drain(d)), std::vector{Event::kDead});
  beats.advance(100ms);  // ... while beats keep real time
  EXPECT_EQ(kinds(drain(d)), std::vector{Event::kBeat});
  EXPECT_EQ(d.until_next(), 100ms);
}

}  // namespace
}  // namespace pushpull::transport
