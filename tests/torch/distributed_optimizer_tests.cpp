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
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "pushpull/collective.h"
#include "pushpull/error.h"
#include "pushpull/torch/distributed_optimizer.h"
#include "support/launched_job.h"
#include "support/process.h"

namespace {

using pushpull::InvalidArgument;
using pushpull::collective::Communicator;
using pushpull::collective::Session;
using pushpull::torch::broadcast_optimizer_state;
using pushpull::torch::broadcast_parameters;
using pushpull::torch::DistributedOptimizer;
using pushpull::torch::DistributedOptimizerOptions;
using pushpull::torch::named;
namespace fs = std::filesystem;

constexpr int kSteps = 4;
constexpr int kShard = 6;  // samples per worker per step
constexpr double kLr = 0.5;
constexpr uint64_t kDataSeed = 7;

torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 3, 3)),
                               torch::nn::Tanh(), torch::nn::Flatten(),
                               torch::nn::Linear(3 * 6 * 6, 10));
}

struct Data {
  std::vector<torch::Tensor> x, y;
};
// Union batches of `workers` x kShard samples, the same in every process.
Data make_data(int workers) {
  torch::manual_seed(kDataSeed);
  Data d;
  for (int s = 0; s < kSteps; ++s) {
    d.x.push_back(torch::randn({workers * kShard, 1, 8, 8}));
    d.y.push_back(torch::randint(0, 10, {workers * kShard}, torch::kLong));
  }
  return d;
}

// The mean loss: the allreduce averages over the workers.
torch::Tensor loss_mean(torch::nn::Sequential& m, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(m->forward(x), y);
}

std::vector<torch::Tensor> clone_all(const std::vector<torch::Tensor>& ps) {
  std::vector<torch::Tensor> out;
  for (const auto& p : ps)
    out.push_back(p.detach().clone());
  return out;
}

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

// max |a - ref| <= tolerance * max |ref|, per tensor.
void expect_close(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& ref,
                  const std::string& what, double tolerance = 1e-5) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), ref[i].sizes()) << what << " parameter " << i;
    const double err = (got[i] - ref[i]).abs().max().item<double>();
    const double scale = ref[i].abs().max().item<double>();
    EXPECT_LE(err, tolerance * scale)
        << what << " parameter " << i << ": max error " << err << " for values up to " << scale;
  }
}

void write_tensors(const std::string& path, const std::vector<torch::Tensor>& ts) {
  std::ofstream f(path, std::ios::binary);
  for (const auto& t : ts) {
    auto c = t.detach().to(torch::kFloat64).contiguous();
    const int64_t n = c.numel();
    f.write(reinterpret_cast<const char*>(&n), sizeof n);
    f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  }
  if (!f) throw pushpull::IoError("cannot write " + path);
}

std::vector<torch::Tensor> read_tensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) ADD_FAILURE() << "cannot read " << path;
  std::vector<torch::Tensor> out;
  int64_t n = 0;
  while (f.read(reinterpret_cast<char*>(&n), sizeof n)) {
    auto t = torch::empty({n}, torch::kFloat64);
    f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    out.push_back(t);
  }
  return out;
}

bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

// The optimizer's state as flat tensors, in parameter order: SGD's momentum
// buffers; Adam's step, exp_avg, exp_avg_sq; then every group's lr.
std::vector<torch::Tensor> optimizer_state(torch::optim::Optimizer& opt) {
  std::vector<torch::Tensor> out;
  for (auto& g : opt.param_groups()) {
    for (auto& p : g.params()) {
      auto it = opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (it == opt.state().end()) {
        out.push_back(torch::zeros({0}));
        continue;
      }
      if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
        out.push_back(s->momentum_buffer().flatten());
      } else if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
        out.push_back(torch::full({1}, static_cast<double>(a->step())));
        out.push_back(a->exp_avg().flatten());
        out.push_back(a->exp_avg_sq().flatten());
      }
    }
    out.push_back(torch::full({1}, g.options().get_lr()));
  }
  return out;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                        torch::nn::Sequential& m, double lr) {
  if (kind == "adam") {
    return std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(lr));
  }
  return std::make_unique<torch::optim::SGD>(m->parameters(),
                                             torch::optim::SGDOptions(lr).momentum(0.9));
}

// ---- The worker (this binary under `pushpull launch -s 0`) ----

struct WorkerArgs {
  std::string scenario, out_dir, optimizer = "sgd";
  int passes = 1;
  double momentum = 0;
  int root = 0;
  bool fp16 = false;             // Compression::kFp16
  std::vector<int> process_set;  // empty: every rank
  double predivide = 1.0;        // gradient_predivide_factor
  int num_groups = 0;            // groups started together
};

// Different initial weights per rank, made rank 0's by broadcast_parameters,
// then kSteps DistributedOptimizer steps on this rank's shard.
void equivalence_worker(const WorkerArgs& a, Session& session) {
  Communicator& comm = session.communicator();
  const int rank = comm.rank(), n = comm.size();
  auto model = make_model(rank == 0 ? 1 : 100 + rank);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(kLr).momentum(a.momentum));
  DistributedOptimizer opt(sgd, named(model->named_parameters()), comm,
                           {.backward_passes_per_step = a.passes,
                            .average_aggregated_gradients = a.passes > 1,
                            .compression = a.fp16 ? pushpull::torch::Compression::kFp16
                                                  : pushpull::torch::Compression::kNone,
                            .process_set = a.process_set,
                            .gradient_predivide_factor = a.predivide,
                            .num_groups = a.num_groups});
  broadcast_parameters(named(model->named_parameters()), 0, comm);
  broadcast_optimizer_state(sgd, 0, comm);
  const Data data = make_data(n);
  const int micro = kShard / a.passes;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    for (int p = 0; p < a.passes; ++p) {
      const int64_t begin = rank * kShard + p * micro;
      loss_mean(model, data.x[s].narrow(0, begin, micro), data.y[s].narrow(0, begin, micro))
          .backward();
    }
    opt.step();
  }
  const auto st = opt.stats();
  const bool member = a.process_set.empty() || std::find(a.process_set.begin(), a.process_set.end(),
                                                         rank) != a.process_set.end();
  const int64_t reductions = member ? kSteps * static_cast<int64_t>(opt.num_parameters()) : 0;
  if (st.steps != kSteps || st.hook_allreduces + st.sync_allreduces != reductions) {
    throw pushpull::Internal("unexpected statistics");
  }
  write_tensors(a.out_dir + "/rank" + std::to_string(rank) + ".bin", model->parameters());
}

// Rank r takes r local steps (rank 0 none: no state at all) with its own
// learning rate, so every rank's optimizer differs; then both broadcasts from
// `root`, then one DistributedOptimizer step on every rank.
void state_worker(const WorkerArgs& a, Session& session) {
  Communicator& comm = session.communicator();
  const int rank = comm.rank(), n = comm.size();
  auto model = make_model(100 + rank);
  auto opt = make_optimizer(a.optimizer, model, 0.01 * (rank + 1));
  const Data data = make_data(n);
  for (int s = 0; s < rank; ++s) {
    opt->zero_grad();
    loss_mean(model, data.x[s], data.y[s]).backward();
    opt->step();
  }
  const std::string base = a.out_dir + "/rank" + std::to_string(rank);
  write_tensors(base + ".before", optimizer_state(*opt));
  broadcast_parameters(named(model->named_parameters()), a.root, comm);
  broadcast_optimizer_state(*opt, a.root, comm);
  write_tensors(base + ".after", optimizer_state(*opt));
  DistributedOptimizer dopt(*opt, named(model->named_parameters()), comm);
  dopt.zero_grad();
  loss_mean(model, data.x[0].narrow(0, rank * kShard, kShard),
            data.y[0].narrow(0, rank * kShard, kShard))
      .backward();
  dopt.step();
  write_tensors(base + ".weights", model->parameters());
}

int dopt_worker(int argc, char** argv) {
  CLI::App app("torch_distributed_optimizer_test worker");
  WorkerArgs a;
  bool unused = false;
  app.add_flag("--dopt-worker", unused);
  app.add_option("--scenario", a.scenario)->required();
  app.add_option("--out-dir", a.out_dir)->required();
  app.add_option("--passes", a.passes);
  app.add_option("--momentum", a.momentum);
  app.add_option("--optimizer", a.optimizer);
  app.add_option("--root", a.root);
  app.add_flag("--fp16", a.fp16);
  app.add_option("--process-set", a.process_set)->delimiter(',');
  app.add_option("--predivide", a.predivide);
  app.add_option("--num-groups", a.num_groups);
  CLI11_PARSE(app, argc, argv);
  try {
    torch::set_num_threads(1);
    Session session(pushpull::Options::from_env());
    if (a.scenario == "equivalence") {
      equivalence_worker(a, session);
    } else {
      state_worker(a, session);
    }
    session.communicator().barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt worker failed: %s\n", e.what());
    return 1;
  }
  return 0;
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

// ---- A world of one, in process ----

struct WorldOfOne : testing::Test {
  Session session{pushpull::Options{}};
  Communicator& comm = session.communicator();
};

TEST_F(WorldOfOne, StepsLikeThePlainOptimizerWithReductionsFromHooks) {
  auto ref_model = make_model(1), model = make_model(1);
  torch::optim::SGD ref(ref_model->parameters(), torch::optim::SGDOptions(kLr).momentum(0.9));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(kLr).momentum(0.9));
  DistributedOptimizer opt(sgd, named(model->named_parameters()), comm);
  const Data data = make_data(1);
  for (int s = 0; s < kSteps; ++s) {
    ref.zero_grad();
    loss_mean(ref_model, data.x[s], data.y[s]).backward();
    ref.step();
    opt.zero_grad();
    loss_mean(model, data.x[s], data.y[s]).backward();
    opt.step();
  }
  for (size_t i = 0; i < model->parameters().size(); ++i)
    EXPECT_TRUE(torch::equal(model->parameters()[i], ref_model->parameters()[i])) << i;
  const auto st = opt.stats();
  const auto n = static_cast<int64_t>(opt.num_parameters());
  EXPECT_EQ(n, 4);
  EXPECT_EQ(st.steps, kSteps);
  EXPECT_EQ(st.hook_allreduces, kSteps * n);  // every gradient as soon as it was ready
  EXPECT_EQ(st.sync_allreduces, 0);
  EXPECT_GE(st.wait_seconds, 0.0);
}

TEST_F(WorldOfOne, SynchronizeThenStepReducesOnceAndUnusedParametersGetZeros) {
  auto used = torch::ones({3}).requires_grad_();
  auto unused = torch::ones({2}).requires_grad_();
  torch::optim::SGD sgd({used, unused}, torch::optim::SGDOptions(0.1));
  DistributedOptimizer opt(sgd, {{"used", used}, {"unused", unused}}, comm,
                           {.op = pushpull::collective::Reduction::kSum});
  (used * 2).sum().backward();
  opt.synchronize();
  ASSERT_TRUE(unused.grad().defined());
  EXPECT_TRUE(torch::equal(unused.grad(), torch::zeros({2})));
  opt.step();
  EXPECT_TRUE(torch::allclose(used.detach(), torch::full({3}, 0.8)));
  EXPECT_TRUE(torch::equal(unused.detach(), torch::ones({2})));
  const auto st = opt.stats();
  EXPECT_EQ(st.hook_allreduces, 1);
  EXPECT_EQ(st.sync_allreduces, 1);
}

TEST_F(WorldOfOne, AccumulatesBackwardPassesAndRefusesOneTooMany) {
  auto w = torch::ones({2}).requires_grad_();
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(1.0));
  DistributedOptimizer opt(sgd, {{"w", w}}, comm,
                           {.backward_passes_per_step = 2, .average_aggregated_gradients = true});
  (w * 1).sum().backward();
  EXPECT_EQ(opt.stats().hook_allreduces, 0);  // not yet: one pass of two
  (w * 3).sum().backward();
  EXPECT_EQ(opt.stats().hook_allreduces, 1);
  try {
    (w * 5).sum().backward();
    ADD_FAILURE() << "a third backward pass was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("backward_passes_per_step"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(opt.zero_grad(), InvalidArgument);  // the allreduce is still pending
  opt.step();
  // (1 + 3) / 2 = 2: the refused pass did not touch the gradient.
  EXPECT_TRUE(torch::allclose(w.detach(), torch::full({2}, -1.0)));
  opt.zero_grad();
}

TEST_F(WorldOfOne, ReducesFloat64AndStopsHookingWhenDestroyed) {
  auto w = torch::ones({4}, torch::kFloat64).requires_grad_();
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.5));
  {
    DistributedOptimizer opt(sgd, {{"w", w}}, comm);
    (w * 2).sum().backward();
    opt.step();
    EXPECT_EQ(opt.stats().hook_allreduces, 1);
  }
  EXPECT_TRUE(torch::allclose(w.detach(), torch::zeros({4}, torch::kFloat64)));
  // No hooks left: three backward passes in a row are plain libtorch again.
  for (int i = 0; i < 3; ++i)
    (w * 1).sum().backward();
  EXPECT_TRUE(torch::allclose(w.grad(), torch::full({4}, 5.0, torch::kFloat64)));
}

TEST_F(WorldOfOne, BroadcastsInAWorldOfOneAndChecksTheRoot) {
  auto model = make_model(1);
  const auto before = clone_all(model->parameters());
  broadcast_parameters(named(model->named_parameters()), 0, comm);
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(torch::equal(model->parameters()[i], before[i]));
  torch::optim::Adam adam(model->parameters());
  broadcast_optimizer_state(adam, 0, comm);
  auto throws = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no InvalidArgument mentioning '" << needle << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  throws([&] { broadcast_parameters(named(model->named_parameters()), 1, comm); }, "root_rank 1");
  throws([&] { broadcast_optimizer_state(adam, -1, comm); }, "root_rank -1");
  auto t = torch::ones({2});
  throws([&] { broadcast_parameters({{"a", t}, {"a", t}}, 0, comm); }, "appears twice");
  throws([&] { broadcast_parameters({{"b", torch::ones({2}, torch::kBool)}}, 0, comm); }, "dtype");
}

TEST_F(WorldOfOne, RejectsBadConstruction) {
  auto model = make_model(1);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  auto params = named(model->named_parameters());
  auto throws = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no InvalidArgument mentioning '" << needle << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto missing = params;
  missing.pop_back();
  throws([&] { DistributedOptimizer d(sgd, missing, comm); }, "not in named_parameters");
  auto twice = params;
  twice.push_back(params.front());
  throws([&] { DistributedOptimizer d(sgd, twice, comm); }, "appears twice");
  throws([&] { DistributedOptimizer d(sgd, params, comm, {.backward_passes_per_step = 0}); },
         "backward_passes_per_step");
  throws(
      [&] {
        DistributedOptimizer d(sgd, params, comm, {.op = pushpull::collective::Reduction::kMax});
      },
      "average or sum");
  throws([&] { DistributedOptimizer d(sgd, params, comm, {.process_set = {0, 0}}); }, "twice");
  throws([&] { DistributedOptimizer d(sgd, params, comm, {.process_set = {1}}); }, "outside 0..0");
  throws([&] { DistributedOptimizer d(sgd, params, comm, {.gradient_predivide_factor = 0}); },
         "gradient_predivide_factor");
  throws(
      [&] {
        DistributedOptimizer d(
            sgd, params, comm,
            {.op = pushpull::collective::Reduction::kSum, .gradient_predivide_factor = 2});
      },
      "only with op average");
  throws([&] { DistributedOptimizer d(sgd, params, comm, {.groups = {{"nope"}}}); },
         "not a parameter the optimizer reduces");
  const std::string first = params.front().first;
  throws(
      [&] {
        DistributedOptimizer d(sgd, params, comm, {.groups = {{first}, {first}}});
      },
      "two groups");
  throws([&] { DistributedOptimizer d(sgd, params, comm, {.num_groups = -1}); }, ">= 0");
  ASSERT_FALSE(pushpull::collective::is_initialized());
  throws([&] { DistributedOptimizer d(sgd, params); }, "collective::init()");
  throws([&] { broadcast_parameters(params, 0); }, "collective::init()");
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--dopt-worker") return dopt_worker(argc, argv);
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
