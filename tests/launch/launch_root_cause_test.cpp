// SPDX-License-Identifier: Apache-2.0
// Units of the launcher: the root cause of a failed job (which failure
// caused the others, the exit code it gives) and the node names in failure
// lines.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "launch/root_cause.h"

namespace pushpull::launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A failed child in the root-cause tests.
ChildState child(std::string label, bool ended, bool exited, int code) {
  ChildState c;
  c.label = std::move(label);
  c.host = "127.0.0.1";
  c.pid = 100;
  c.ended = ended;
  c.exited = exited;
  c.code = code;
  return c;
}

FailureEvent child_event(size_t i) {
  return {FailureEvent::Kind::kChild, i, ""};
}
FailureEvent scheduler_event(std::string m) {
  return {FailureEvent::Kind::kScheduler, 0, std::move(m)};
}

TEST(RootCause, ASignalBeatsTheExitsItCaused) {
  // server 0 is reaped first (exit 1), then worker 1 (SIGKILL).
  std::vector<ChildState> c = {child("server 0", true, true, 1), child("worker 0", false, false, 0),
                               child("worker 1", true, false, 9)};
  auto r = find_root_cause(c, {child_event(0), child_event(2)});
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_EQ(r.reason, "worker 1 (pid 100, host 127.0.0.1) was killed by signal 9 (SIGKILL)");
  EXPECT_THAT(r.consequences, ElementsAre("server 0 exited with code 1"));
}

TEST(RootCause, TheSchedulersVerdictBeatsLaterExits) {
  // worker 1 was stopped (SIGSTOP): the heartbeats caught it; the others
  // exit because of it, one of them with a code other than 1.
  std::vector<ChildState> c = {child("server 0", true, true, 3), child("worker 0", true, true, 1),
                               child("worker 1", false, false, 0)};
  auto r = find_root_cause(
      c, {scheduler_event("worker 1 (host 127.0.0.1:4000) failed: no heartbeat for 5000 ms"),
          child_event(0), child_event(1)});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.reason,
            "worker 1 (pid 100, host 127.0.0.1) failed (reported by the scheduler): no heartbeat "
            "for 5000 ms");
  EXPECT_THAT(r.consequences,
              ElementsAre("server 0 exited with code 3", "worker 0 exited with code 1"));
}

TEST(RootCause, APeerFailureLineNamesTheVictim) {
  // server 0's exit is seen before the scheduler says anything; its output
  // blamed worker 1, which the heartbeats caught.
  std::vector<ChildState> c = {child("server 0", true, true, 1),
                               child("worker 1", false, false, 0)};
  c[0].blames = "worker 1";
  c[0].blame_line = "PeerFailure: worker 1 (host 127.0.0.1:4000) failed: no heartbeat";
  auto r = find_root_cause(c, {child_event(0)});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.reason, ::testing::StartsWith("worker 1 (pid 100, host 127.0.0.1) failed (reported "
                                              "by server 0): no heartbeat"));
  EXPECT_THAT(r.consequences, ElementsAre("server 0 exited with code 1"));
}

TEST(RootCause, TheNamedNodesOwnExitGivesTheCode) {
  // The scheduler saw worker 1's connection close before worker 1 was reaped.
  std::vector<ChildState> c = {child("worker 0", true, true, 1), child("worker 1", true, true, 3)};
  auto r = find_root_cause(c, {scheduler_event("worker 1 (host h:1) failed: its connection closed"),
                               child_event(0), child_event(1)});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.reason, "worker 1 (pid 100, host 127.0.0.1) exited with code 3");
  EXPECT_THAT(r.consequences, ElementsAre("worker 0 exited with code 1"));
}

TEST(RootCause, AServerWhoseLossLeftNoReplicaSaysSo) {
  // Server 0, killed while server 1 catches up: reaped before the
  // scheduler's report; the final line names it and says why the job could
  // not go on without it (found by the survive mode: the reason was lost).
  std::vector<ChildState> c = {child("server 0", true, false, 9), child("worker 0", true, true, 3)};
  auto r = find_root_cause(
      c, {child_event(0),
          scheduler_event("server 0 (host h:1) failed: its connection closed; no replica left: "
                          "the key ranges placed on server 0 lived on servers 0, 1, all dead"),
          child_event(1)});
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_EQ(r.reason,
            "server 0 (pid 100, host 127.0.0.1) was killed by signal 9 (SIGKILL); no replica left: "
            "the key ranges placed on server 0 lived on servers 0, 1, all dead");
}

TEST(RootCause, AWorkerThatExitedZeroWhileOthersWaited) {
  std::vector<ChildState> c = {child("worker 0", false, false, 0),
                               child("worker 1", true, true, 0)};
  auto r = find_root_cause(
      c, {scheduler_event("worker 1 (host :0) failed: its process exited (code 0) without joining "
                          "the job, while registered workers wait for it to register")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.reason,
              ::testing::StartsWith("worker 1 (pid 100, host 127.0.0.1) failed (reported "
                                    "by the scheduler, exited with code 0): its process"));
}

TEST(RootCause, ASpecificCodeBeatsTheGenericOne) {
  std::vector<ChildState> c = {child("worker 0", true, true, 1), child("worker 1", true, true, 3)};
  auto r = find_root_cause(c, {child_event(0), child_event(1)});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.reason, HasSubstr("worker 1"));
}

TEST(RootCause, ASchedulerFailureNamingNoChild) {
  std::vector<ChildState> c = {child("worker 0", false, false, 0)};
  auto r = find_root_cause(c, {scheduler_event("only 0 of 1 servers registered within 100 ms")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.reason, "the scheduler reported: only 0 of 1 servers registered within 100 ms");
}

TEST(RootCause, ARelayedSchedulerVerdictBeatsTheExitThatRelayedIt) {
  // The scheduler's own report is not in yet; worker 0 relays it and exits 1.
  std::vector<ChildState> c = {child("worker 0", true, true, 1)};
  c[0].blames = blamed_in(
      "[pushpull E] PeerFailure: the scheduler ended the job: only 1 of 2 workers registered");
  c[0].blame_line = "PeerFailure: the scheduler ended the job: only 1 of 2 workers registered";
  EXPECT_EQ(c[0].blames, "scheduler");
  auto r = find_root_cause(c, {child_event(0)});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.reason, "the scheduler reported: only 1 of 2 workers registered");
  EXPECT_THAT(r.consequences, ElementsAre("worker 0 exited with code 1"));
}

TEST(RootCause, NodeNames) {
  EXPECT_EQ(node_named_in("PeerFailure: worker 12 (host 1.2.3.4:5) failed: x"), "worker 12");
  EXPECT_EQ(node_named_in("server: PeerFailure: server 0 (host h:1) failed"), "server 0");
  EXPECT_EQ(node_named_in("the worker 3 said hello"), std::nullopt);
  EXPECT_EQ(node_named_in("worker 1 (not registered; host unknown) failed"), "worker 1");
  EXPECT_EQ(node_named_in("scheduler (host h:1) failed"), std::nullopt);
  // The collectives name members by rank: a job's collective rank is its worker rank.
  EXPECT_EQ(node_named_in("PeerFailure: collective: rank 1 (host 127.0.0.1:4000) failed: no "
                          "heartbeat"),
            "worker 1");
  EXPECT_EQ(node_named_in("collective: rank 1 shut down its communicator"), std::nullopt);
  EXPECT_EQ(blamed_in("server: PeerFailure: worker 2 (host h:1) failed: x"), "worker 2");
  EXPECT_EQ(blamed_in("worker 2 (host h:1) failed: x"), "");
  EXPECT_EQ(blamed_in("lenet: error: collective: rank 2 (host h:1) failed: no heartbeat"),
            "worker 2");
  EXPECT_EQ(blamed_in("collective: rank 0 fails its pending operations: collective: rank 2 "
                      "(host h:1) failed: x"),
            "worker 2");
  EXPECT_EQ(blamed_in("PeerFailure: scheduler (host h:1) failed: closed"), "");
}

}  // namespace
}  // namespace pushpull::launch
