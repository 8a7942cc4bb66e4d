// SPDX-License-Identifier: Apache-2.0
// Tests of pushpull::torch::DistributedOptimizer, broadcast_parameters and
// broadcast_optimizer_state.
//
// Equivalence: N workers (processes through `pushpull launch -n N -s 0`), each
// starting from different weights made identical by broadcast_parameters,
// each taking b samples per step, end k steps with the same weights (1e-5
// relative) as one plain libtorch process taking the union batch N*b with
// torch::optim::SGD. The workers are this binary in --dopt-worker mode.
// A world of one (collective::Session with nothing set) covers hooks,
// statistics and the error cases in process.
// The worker mode: dopt_worker.cpp; the world of one: dopt_world_of_one_tests.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dopt_fixture.h"
#include "pushpull/collective.h"
#include "pushpull/error.h"
#include "pushpull/torch/distributed_optimizer.h"
#include "support/launched_job.h"
#include "support/process.h"

namespace {

using namespace dopt_test;

// Plain torch::optim::SGD on the union batch from make_model(1)'s weights.
std::vector<torch::Tensor> reference_weights(int workers, double momentum) {
  auto model = make_model(1);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(kLr).momentum(momentum));
  const Data data = make_data(workers);
  for (int s = 0; s < kSteps; ++s) {
    sgd.zero_grad();
    loss_mean(model, data.x[s], data.y[s]).backward();
    sgd.step();
  }
  return clone_all(model->parameters());
}

// Plain SGD from make_model(1)'s weights on the union of the given ranks'
// shards of make_data(workers) (what a process set of those ranks computes).
std::vector<torch::Tensor> reference_on_shards(int workers, const std::vector<int>& shards) {
  auto model = make_model(1);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(kLr));
  const Data data = make_data(workers);
  for (int s = 0; s < kSteps; ++s) {
    std::vector<torch::Tensor> xs, ys;
    for (int r : shards) {
      xs.push_back(data.x[s].narrow(0, r * kShard, kShard));
      ys.push_back(data.y[s].narrow(0, r * kShard, kShard));
    }
    sgd.zero_grad();
    loss_mean(model, torch::cat(xs), torch::cat(ys)).backward();
    sgd.step();
  }
  std::vector<torch::Tensor> flat;
  for (auto& t : model->parameters())
    flat.push_back(t.detach().flatten().to(torch::kFloat64));
  return flat;
}

bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

// Runs `pushpull launch -n N -s 0` with this binary as the workers.
void launch_workers(int n, const fs::path& dir, std::vector<std::string> worker_args) {
  worker_args.insert(worker_args.begin(), {"--dopt-worker", "--out-dir", dir.string()});
  const std::vector<std::string> argv = pushpull::test::launch_self(n, worker_args);
  pushpull::test::ChildProcess child(argv);
  auto rc = child.wait(std::chrono::seconds(180));
  ASSERT_TRUE(rc.has_value()) << "workers did not finish in 180 s:\n" << child.output();
  ASSERT_EQ(*rc, 0) << child.output();
}

struct TempDir {
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("pp_dopt_" + std::to_string(::getpid()) + "_" + tag)) {
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

// ---- Equivalence through the launcher ----

struct EqSetup {
  int workers;
  int passes;
  double momentum;
};

class DistributedOptimizerEquivalence : public testing::TestWithParam<EqSetup> {};

TEST_P(DistributedOptimizerEquivalence, MatchesOneProcessOnTheUnionBatch) {
  const EqSetup s = GetParam();
  TempDir dir("eq_" + std::to_string(s.workers) + "_" + std::to_string(s.passes));
  launch_workers(s.workers, dir.path,
                 {"--scenario", "equivalence", "--passes", std::to_string(s.passes), "--momentum",
                  std::to_string(s.momentum)});
  const auto ref = reference_weights(s.workers, s.momentum);
  for (int r = 0; r < s.workers; ++r) {
    expect_close(
        read_tensors((dir.path / ("rank" + std::to_string(r) + ".bin")).string()),
        [&] {
          std::vector<torch::Tensor> flat;
          for (auto& t : ref)
            flat.push_back(t.flatten().to(torch::kFloat64));
          return flat;
        }(),
        "worker " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(Launched, DistributedOptimizerEquivalence,
                         testing::Values(EqSetup{2, 1, 0.0}, EqSetup{3, 1, 0.9},
                                         EqSetup{2, 2, 0.0}),
                         [](const testing::TestParamInfo<EqSetup>& i) {
                           return std::to_string(i.param.workers) + "_workers_" +
                                  std::to_string(i.param.passes) + "_passes" +
                                  (i.param.momentum > 0 ? "_momentum" : "");
                         });

// fp16 compression with a predivide factor: the same steps as one process on
// the union batch, up to float16's rounding of the gradients (the Python
// front end's tolerance, 2e-3). A process set {0, 2} of 3 ranks, also with
// fp16: ranks 0 and 2 train on their two shards together, rank 1 (outside)
// alone on its own, from the broadcast weights; its members' allreduces
// start in two groups (num_groups).
TEST(DistributedOptimizerOptionsLaunched, Fp16WithPredivideMatchesTheUnionBatch) {
  TempDir dir("fp16");
  launch_workers(2, dir.path,
                 {"--scenario", "equivalence", "--fp16", "--predivide", "2", "--momentum", "0"});
  const auto ref = reference_on_shards(2, {0, 1});
  for (int r = 0; r < 2; ++r)
    expect_close(read_tensors((dir.path / ("rank" + std::to_string(r) + ".bin")).string()), ref,
                 "fp16 worker " + std::to_string(r), 2e-3);
}

TEST(DistributedOptimizerOptionsLaunched, AProcessSetReducesAmongItsMembersOnly) {
  TempDir dir("set");
  launch_workers(3, dir.path,
                 {"--scenario", "equivalence", "--fp16", "--process-set", "0,2", "--num-groups",
                  "2", "--momentum", "0"});
  const auto members = reference_on_shards(3, {0, 2});
  const auto alone = reference_on_shards(3, {1});
  for (int r : {0, 2})
    expect_close(read_tensors((dir.path / ("rank" + std::to_string(r) + ".bin")).string()), members,
                 "member " + std::to_string(r), 2e-3);
  expect_close(read_tensors((dir.path / "rank1.bin").string()), alone, "rank 1 (outside)", 1e-5);
}

// ---- broadcast_parameters / broadcast_optimizer_state through the launcher ----

class BroadcastState : public testing::TestWithParam<const char*> {};

TEST_P(BroadcastState, MakesEveryReplicaIdentical) {
  const std::string kind = GetParam();
  constexpr int kWorkers = 3, kRoot = 1;
  TempDir dir("state_" + kind);
  launch_workers(kWorkers, dir.path,
                 {"--scenario", "state", "--optimizer", kind, "--root", std::to_string(kRoot)});
  auto file = [&](int r, const char* ext) {
    return read_tensors((dir.path / ("rank" + std::to_string(r) + ext)).string());
  };
  const auto root_before = file(kRoot, ".before");
  const auto root_weights = file(kRoot, ".weights");
  ASSERT_FALSE(root_before.empty());
  for (int r = 0; r < kWorkers; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    if (r != kRoot) {
      // Not vacuous: every other rank started with another state (rank 0 none).
      EXPECT_FALSE(all_equal(file(r, ".before"), root_before));
    }
    EXPECT_TRUE(all_equal(file(r, ".after"), root_before));
    // Same weights, same state and the averaged gradient: the same next step.
    EXPECT_TRUE(all_equal(file(r, ".weights"), root_weights));
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, BroadcastState, testing::Values("sgd", "adam"));
}  // namespace

using dopt_test::dopt_worker;

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--dopt-worker") return dopt_worker(argc, argv);
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
