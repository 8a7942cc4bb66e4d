// SPDX-License-Identifier: Apache-2.0
// A sample of the deterministic simulation's seeds (tests/sim/ps_world.h):
// every seed's job pulls exactly the reference values, never hangs, and
// survives whenever its replication factor allows. `make simulate` runs
// 10^4 seeds. A failing seed prints its fault schedule; replay it with
// `build/bin/ps_sim --seed N`.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "sim/ps_world.h"

namespace pushpull::sim {
namespace {

TEST(PsSimulation, ASampleOfSeedsKeepsEveryRoundExactAndNeverHangs) {
  const char* env = std::getenv("PUSHPULL_SIM_SEEDS");
  const uint64_t seeds = env ? std::strtoull(env, nullptr, 10) : 2000;
  int failed_cleanly = 0, faults = 0;
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    const Scenario s = scenario_for_seed(seed);
    const Outcome o = run(s);
    faults += static_cast<int>(s.faults.size());
    failed_cleanly += o.failed_cleanly;
    if (!o.violations.empty()) {
      ADD_FAILURE() << s.describe() << "\n" << fmt::format("{}", fmt::join(o.violations, "\n"));
      return;
    }
    EXPECT_TRUE(o.finished || o.failed_cleanly) << s.describe();
  }
  // The sample must exercise both outcomes and real fault schedules.
  EXPECT_GT(faults, static_cast<int>(seeds));
  EXPECT_GT(failed_cleanly, 0);
  EXPECT_LT(failed_cleanly, static_cast<int>(seeds) / 2);
}

// Schedules that found bugs, kept as regressions (with the world seed they
// were found with: the network's delays replay too). 28576 (R = 2, two
// servers killed): a re-sent round acknowledged by a promoted backup before
// its own backup had it, lost when that backup was promoted next (pulls a
// round behind); 1232: a restarted worker adopted a round a promoted backup
// held only as a replica, then two servers died: it pulled values a round
// behind, and the job hung.
TEST(PsSimulation, SchedulesThatFoundBugsStayFixed) {
  Scenario lost_round{28576,
                      3,
                      2,
                      2,
                      true,
                      10,
                      0,
                      {{Fault::kKill, 1, 5240, 0},
                       {Fault::kKill, 2, 7611, 0},
                       {Fault::kKillWorker, 0, 27665, 6410}}};
  Scenario adopted{1232,
                   4,
                   2,
                   2,
                   true,
                   10,
                   2,
                   {{Fault::kKillWorker, 1, 15824, 1724},
                    {Fault::kKill, 0, 16605, 0},
                    {Fault::kKill, 1, 18993, 0}}};
  // Server rejoin: 38 (a late placement closed the restarted server's new
  // connection), 1543 (a rejoin request served before the placement it
  // names), 3716 (pushes meant for a restarted server's predecessor applied
  // on it, a backup, and lost).
  Scenario late_placement{
      38,
      4,
      3,
      2,
      true,
      9,
      4,
      {{Fault::kPartition, 0, 21758, 1537949, Fault::kWorker, 1}, {Fault::kKill, 2, 24315, 8061}}};
  Scenario early_request{1543,
                         3,
                         2,
                         1,
                         true,
                         15,
                         4,
                         {{Fault::kKillWorker, 0, 5039, 19758},
                          {Fault::kPartition, 1, 28484, 2870131, Fault::kScheduler, 0},
                          {Fault::kKill, 0, 28605, 2118}}};
  Scenario predecessors_pushes{3716,
                               4,
                               3,
                               3,
                               false,
                               13,
                               0,
                               {{Fault::kKill, 1, 22649, 772},
                                {Fault::kKillWorker, 1, 32401, 17433},
                                {Fault::kKillWorker, 1, 35043, 12460}}};
  for (const Scenario& s :
       {lost_round, adopted, late_placement, early_request, predecessors_pushes}) {
    const Outcome o = run(s);
    EXPECT_TRUE(o.violations.empty()) << s.describe() << "\n" << o.violations.front();
    EXPECT_TRUE(o.finished || o.failed_cleanly) << s.describe();
  }
}

TEST(PsSimulation, ASeedReplaysExactly) {
  for (uint64_t seed : {7u, 123u, 4242u}) {
    const Outcome a = run(scenario_for_seed(seed)), b = run(scenario_for_seed(seed));
    EXPECT_EQ(a.events, b.events) << seed;
    EXPECT_EQ(a.end_us, b.end_us) << seed;
    EXPECT_EQ(a.finished, b.finished) << seed;
  }
}

TEST(PsSimulation, TwoFailuresWithTwoBackupsLoseNoAcknowledgedRound) {
  // The schedule of the bug re-publishing fixes (R = 2): the primary dies
  // mid-replication, then the backup that took over, soon after.
  int survived = 0;
  for (uint64_t at = 1'000; at < 40'000; at += 700) {
    Scenario s;
    s.seed = at;
    s.servers = 4;
    s.workers = 2;
    s.replicas = 2;
    s.rounds = 12;
    s.faults = {{Fault::kKill, 0, at, 0}, {Fault::kKill, 1, at + 1'500, 0}};
    const Outcome o = run(s);
    ASSERT_TRUE(o.violations.empty()) << s.describe() << "\n" << o.violations.front();
    survived += o.finished;
  }
  EXPECT_GT(survived, 0);
}

}  // namespace
}  // namespace pushpull::sim
