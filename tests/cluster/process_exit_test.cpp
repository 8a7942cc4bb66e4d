// SPDX-License-Identifier: Apache-2.0
// Scheduler::process_exited: what the launcher reports when a node's process
// ends, with a scheduler and nodes as threads of this process.
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "cluster/node.h"
#include "cluster/scheduler.h"
#include "support/wait.h"

namespace pushpull::cluster {
namespace {

using namespace std::chrono_literals;

Options job(int servers, int workers) {
  Options o;
  o.net.node_host = "127.0.0.1";
  o.cluster.root_uri = "127.0.0.1";
  o.cluster.root_port = 0;
  o.cluster.num_servers = servers;
  o.cluster.num_workers = workers;
  o.cluster.heartbeat_interval = 100ms;
  o.cluster.heartbeat_timeout = 5000ms;
  o.cluster.startup_timeout = 60000ms;
  return o;
}

// A scheduler running on its own thread, plus nodes started on threads of
// their own (start() blocks until the book arrives).
struct Job {
  explicit Job(Options o, const ClockSource& clock = steady_clock_source())
      : options(std::move(o)), scheduler(options, clock) {
    options.cluster.root_port = scheduler.bind();
    result = std::async(std::launch::async, [this] { return scheduler.run(); });
  }
  ~Job() {
    scheduler.stop();  // fails every node still in start()
    if (result.valid()) result.wait();
    for (auto& f : started)
      if (f.valid()) f.wait();
    nodes.clear();
  }
  Node& add(Role role, int rank, Millis heartbeat_interval = Millis{0}) {
    Options no = options;
    if (heartbeat_interval > Millis{0}) no.cluster.heartbeat_interval = heartbeat_interval;
    no.cluster.role = role;
    no.cluster.preferred_rank = rank;
    nodes.push_back(std::make_unique<Node>(no));
    Node* n = nodes.back().get();
    started.push_back(std::async(std::launch::async, [n] { n->start(); }));
    return *n;
  }
  void wait_registered(int n) {
    ASSERT_TRUE(test::wait_until([&] { return scheduler.registered() >= n; }));
  }
  Status finish() {
    if (result.wait_for(10s) != std::future_status::ready) {
      ADD_FAILURE() << "the scheduler did not end the job";
      scheduler.stop();
    }
    return result.get();
  }

  Options options;
  Scheduler scheduler;
  std::future<Status> result;
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<std::future<void>> started;
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ProcessExit, NonzeroExitFailsTheJobNamingTheNode) {
  Job j(job(1, 2));
  j.add(Role::kServer, 0);
  j.add(Role::kWorker, 0);
  j.add(Role::kWorker, 1);
  for (auto& f : j.started)
    f.get();
  j.scheduler.process_exited(Role::kWorker, 1, 3, 0);
  Status st = j.finish();
  EXPECT_EQ(st.code(), ErrorCode::kPeerFailure);
  EXPECT_TRUE(contains(st.message(), "worker 1")) << st.message();
  EXPECT_TRUE(contains(st.message(), "exited with code 3")) << st.message();
  EXPECT_TRUE(contains(st.message(), "127.0.0.1")) << st.message();
  // Every surviving node hears the same verdict.
  for (size_t i : {0u, 1u})
    ASSERT_TRUE(test::wait_until([&] { return !j.nodes[i]->failure().is_ok(); }));
  EXPECT_TRUE(contains(j.nodes[0]->failure().message(), "worker 1"));
  EXPECT_TRUE(contains(j.nodes[1]->failure().message(), "worker 1"));
}

TEST(ProcessExit, TheFirstFailureIsTheRootCauseLaterOnesAreConsequences) {
  Job j(job(1, 2));
  j.add(Role::kServer, 0);
  j.add(Role::kWorker, 0);
  j.add(Role::kWorker, 1);
  for (auto& f : j.started)
    f.get();
  j.scheduler.process_exited(Role::kWorker, 0, 0, 9);
  j.scheduler.process_exited(Role::kServer, 0, 1, 0);
  j.scheduler.process_exited(Role::kWorker, 1, 1, 0);
  Status st = j.finish();
  EXPECT_TRUE(contains(st.message(), "worker 0")) << st.message();
  EXPECT_TRUE(contains(st.message(), "signal 9 (SIGKILL)")) << st.message();
}

TEST(ProcessExit, ASignalBeforeRegistrationFailsTheJobToo) {
  Job j(job(1, 2));
  j.add(Role::kServer, 0);
  j.wait_registered(1);
  j.scheduler.process_exited(Role::kWorker, 1, 0, 15);
  Status st = j.finish();
  EXPECT_TRUE(contains(st.message(), "worker 1")) << st.message();
  EXPECT_TRUE(contains(st.message(), "SIGTERM")) << st.message();
  EXPECT_THROW(j.started[0].get(), PeerFailure);
}

TEST(ProcessExit, ExitsAfterAnOrderlyLeaveAreNormal) {
  Job j(job(1, 2));
  j.add(Role::kServer, 0);
  j.add(Role::kWorker, 0);
  j.add(Role::kWorker, 1);
  for (auto& f : j.started)
    f.get();
  std::vector<std::future<void>> left;
  left.push_back(std::async(std::launch::async, [&] {
    j.nodes[0]->wait_for_workers();
    j.nodes[0]->shutdown();
  }));
  for (size_t i : {1u, 2u})
    left.push_back(std::async(std::launch::async, [&, i] { j.nodes[i]->shutdown(); }));
  for (auto& f : left)
    f.get();
  j.scheduler.process_exited(Role::kWorker, 0, 0, 0);
  j.scheduler.process_exited(Role::kWorker, 1, 0, 0);
  j.scheduler.process_exited(Role::kServer, 0, 0, 0);
  EXPECT_TRUE(j.finish().is_ok());
}

TEST(ProcessExit, WorkersThatNeverJoinEndTheJobAndStopTheServers) {
  Job j(job(2, 2));
  j.add(Role::kServer, 0);
  j.add(Role::kServer, 1);
  j.wait_registered(2);
  j.scheduler.process_exited(Role::kWorker, 1, 0, 0);
  j.scheduler.process_exited(Role::kWorker, 0, 0, 0);
  // The servers' start() returns and their orderly end completes at once.
  for (size_t i : {0u, 1u}) {
    ASSERT_EQ(j.started[i].wait_for(5s), std::future_status::ready);
    j.started[i].get();
    EXPECT_EQ(j.nodes[i]->rank(), -1);
    j.nodes[i]->wait_for_workers();
    j.nodes[i]->shutdown();
  }
  EXPECT_TRUE(j.finish().is_ok());
}

// One program for every role that never uses the scheduler (MXNet-style
// scripts run as servers too): clean exits in any order end the job well.
TEST(ProcessExit, ProcessesThatNeverJoinEndTheJobWellWhateverTheirRole) {
  Job j(job(2, 2));
  j.scheduler.process_exited(Role::kServer, 1, 0, 0);
  j.scheduler.process_exited(Role::kWorker, 0, 0, 0);
  j.scheduler.process_exited(Role::kServer, 0, 0, 0);
  j.scheduler.process_exited(Role::kWorker, 1, 0, 0);
  EXPECT_TRUE(j.finish().is_ok());
}

TEST(ProcessExit, AWorkerExitingWhileOthersWaitForItFailsNamingIt) {
  Job j(job(1, 2));
  j.add(Role::kServer, 0);
  j.add(Role::kWorker, 1);
  j.wait_registered(2);
  j.scheduler.process_exited(Role::kWorker, 0, 0, 0);
  Status st = j.finish();
  EXPECT_EQ(st.code(), ErrorCode::kPeerFailure);
  EXPECT_TRUE(contains(st.message(), "worker 0")) << st.message();
  EXPECT_TRUE(contains(st.message(), "without joining the job")) << st.message();
  try {
    j.started[1].get();
    FAIL() << "worker 1 started";
  } catch (const PeerFailure& e) {
    EXPECT_TRUE(contains(e.what(), "worker 0")) << e.what();
  }
}

TEST(ProcessExit, AWorkerThatRegistersAfterAnotherExitedWithoutJoiningFails) {
  Job j(job(1, 2));
  j.add(Role::kServer, 0);
  j.wait_registered(1);
  j.scheduler.process_exited(Role::kWorker, 0, 0, 0);
  j.add(Role::kWorker, 1);
  Status st = j.finish();
  EXPECT_TRUE(contains(st.message(), "worker 0")) << st.message();
}

TEST(ProcessExit, AnUnjoinedExitFailsOnceTheGraceForTheOthersIsOver) {
  ManualClock clock;
  Job j(job(1, 2), clock);
  j.add(Role::kServer, 0);
  j.wait_registered(1);
  j.scheduler.process_exited(Role::kWorker, 0, 0, 0);
  clock.advance(1900ms);
  EXPECT_NE(j.result.wait_for(300ms), std::future_status::ready);
  clock.advance(200ms);
  Status st = j.finish();
  EXPECT_TRUE(contains(st.message(), "worker 0")) << st.message();
  EXPECT_TRUE(contains(st.message(), "1 other workers did not finish")) << st.message();
}

TEST(ProcessExit, ExitZeroWithoutLeavingIsAFailure) {
  Job j(job(1, 1));
  j.add(Role::kServer, 0);
  j.add(Role::kWorker, 0);
  for (auto& f : j.started)
    f.get();
  j.scheduler.process_exited(Role::kServer, 0, 0, 0);
  Status st = j.finish();
  EXPECT_TRUE(contains(st.message(), "server 0")) << st.message();
  EXPECT_TRUE(contains(st.message(), "without leaving")) << st.message();
}

// An engine of a node (the collectives' detector) found the job failed by
// itself: the scheduler ends the job with that reason, naming the node the
// engine named, not the node that reported it.
TEST(FailureReport, TheSchedulerEndsTheJobWithTheReportedReason) {
  Job j(job(1, 2));
  j.add(Role::kServer, 0);
  j.add(Role::kWorker, 0);
  j.add(Role::kWorker, 1);
  for (auto& f : j.started)
    f.get();
  const std::string why = "collective: worker 1 (host 127.0.0.1:1) failed: no heartbeat";
  j.nodes[1]->report_failure(Status(ErrorCode::kPeerFailure, why));
  EXPECT_EQ(j.nodes[1]->failure().message(), why);
  Status st = j.finish();
  EXPECT_EQ(st.code(), ErrorCode::kPeerFailure);
  EXPECT_EQ(st.message(), why);
  for (auto& n : j.nodes)
    ASSERT_TRUE(test::wait_until([&] { return n->failure().message() == why; }))
        << n->failure().message();
  // Exits that follow are consequences: the root cause stays.
  j.scheduler.process_exited(Role::kWorker, 0, 3, 0);
  EXPECT_EQ(st.message(), why);
}

// The scheduler's silence limit on a manual clock: worker 1 heartbeats only
// once an hour (as if stopped after registering), the others every 100 ms.
TEST(Heartbeats, ASilentNodeIsDeclaredDeadOnlyAfterTheTimeout) {
  ManualClock clock;
  Options o = job(1, 2);
  o.cluster.heartbeat_timeout = 2000ms;
  Job j(o, clock);
  j.add(Role::kServer, 0);
  j.add(Role::kWorker, 0);
  j.add(Role::kWorker, 1, std::chrono::hours(1));
  for (auto& f : j.started)
    f.get();
  clock.advance(1000ms);
  // Real time for the others' heartbeats to be heard at the new time.
  std::this_thread::sleep_for(600ms);
  EXPECT_NE(j.result.wait_for(200ms), std::future_status::ready) << "declared too early";
  clock.advance(1001ms);  // worker 1 silent 2001 ms, the others about 1001 ms
  Status st = j.finish();
  EXPECT_EQ(st.code(), ErrorCode::kPeerFailure);
  EXPECT_TRUE(contains(st.message(), "worker 1 (host 127.0.0.1:")) << st.message();
  EXPECT_TRUE(contains(st.message(), "no heartbeat for 2001 ms (limit 2000 ms)")) << st.message();
}

}  // namespace
}  // namespace pushpull::cluster
