// SPDX-License-Identifier: Apache-2.0
// DistributedOptimizer with sparse COO gradients (an nn::Embedding with
// sparse(true) beside a dense Linear): by default allgathered (indices and
// values), with sparse_as_dense densified for the allreduce and handed back
// sparse.
//
// Equivalence: N workers (this binary in --sparse-worker mode under
// `pushpull launch -n N -s 0`), all starting from the same weights, each
// taking kShard samples per step, end kSteps steps with the weights (1e-5
// relative) of one plain libtorch process taking the union batch with the
// same optimizer (SGD, or Adagrad, which libtorch 1.13 steps on sparse
// gradients). Every worker checks that the embedding's gradient it hands the
// optimizer is sparse.
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
#include "sparse_net.h"
#include "support/launched_job.h"
#include "support/process.h"

namespace {

using pushpull::InvalidArgument;
using pushpull::collective::Communicator;
using pushpull::collective::Session;
using pushpull::torch::DistributedOptimizer;
using pushpull::torch::DistributedOptimizerOptions;
using pushpull::torch::named;
namespace fs = std::filesystem;
using namespace sparse_net;

struct Data {
  std::vector<torch::Tensor> x, y;
};
// Union batches of `workers` x kShard samples, the same in every process.
Data make_data(int workers) {
  torch::manual_seed(11);
  Data d;
  for (int s = 0; s < kSteps; ++s) {
    d.x.push_back(torch::randint(0, kVocab, {workers * kShard, kLen}, torch::kLong));
    d.y.push_back(torch::randint(0, 3, {workers * kShard}, torch::kLong));
  }
  return d;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, Net& net) {
  // An initial accumulator makes Adagrad's step depend on the gradient's
  // scale (an average of the ranks' gradients, not their sum).
  if (kind == "adagrad") {
    return std::make_unique<torch::optim::Adagrad>(
        net->parameters(), torch::optim::AdagradOptions(kLr).initial_accumulator_value(0.1));
  }
  return std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(kLr));
}

torch::Tensor loss_of(Net& net, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(net->forward(x), y);
}

// The plain optimizer on the union of `shards`' samples of make_data(workers).
torch::Tensor reference(const std::string& optimizer, int workers, const std::vector<int>& shards) {
  auto net = make_net();
  auto opt = make_optimizer(optimizer, net);
  const Data data = make_data(workers);
  for (int s = 0; s < kSteps; ++s) {
    std::vector<torch::Tensor> xs, ys;
    for (int r : shards) {
      xs.push_back(data.x[s].narrow(0, r * kShard, kShard));
      ys.push_back(data.y[s].narrow(0, r * kShard, kShard));
    }
    opt->zero_grad();
    loss_of(net, torch::cat(xs), torch::cat(ys)).backward();
    opt->step();
  }
  return flat(net);
}

// kSteps steps of the DistributedOptimizer on this rank's shard (each step's
// batch backward_passes_per_step times); throws when the embedding's gradient
// after synchronize() is not sparse.
torch::Tensor train(Communicator& comm, const std::string& optimizer, int workers,
                    DistributedOptimizerOptions options) {
  auto net = make_net();
  auto inner = make_optimizer(optimizer, net);
  const int opt_passes = options.backward_passes_per_step;
  DistributedOptimizer opt(*inner, named(net->named_parameters()), comm, std::move(options));
  const Data data = make_data(workers);
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    for (int k = 0; k < opt_passes; ++k)
      loss_of(net, data.x[s].narrow(0, comm.rank() * kShard, kShard),
              data.y[s].narrow(0, comm.rank() * kShard, kShard))
          .backward();
    opt.synchronize();
    if (!net->emb->weight.grad().is_sparse())
      throw pushpull::InvalidArgument("the embedding's gradient after synchronize() is dense");
    opt.step();
  }
  return flat(net);
}

int sparse_worker(int argc, char** argv) {
  CLI::App app("torch_dopt_sparse_test worker");
  bool unused = false, as_dense = false;
  std::string optimizer, out_dir;
  std::vector<int> set;
  int workers = 0;
  app.add_flag("--sparse-worker", unused);
  app.add_option("--optimizer", optimizer)->required();
  app.add_option("--out-dir", out_dir)->required();
  app.add_option("--workers", workers)->required();
  app.add_flag("--sparse-as-dense", as_dense);
  app.add_option("--process-set", set)->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  try {
    torch::set_num_threads(1);
    Session session(pushpull::Options::from_env());
    const auto w = train(session.communicator(), optimizer, workers,
                         {.process_set = set, .sparse_as_dense = as_dense});
    std::ofstream f(out_dir + "/rank" + std::to_string(session.rank()) + ".bin", std::ios::binary);
    f.write(static_cast<const char*>(w.data_ptr()), static_cast<std::streamsize>(w.nbytes()));
    if (!f) throw pushpull::IoError("cannot write the weights");
    session.communicator().barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparse worker failed: %s\n", e.what());
    return 1;
  }
  return 0;
}

torch::Tensor read_weights(const fs::path& path, int64_t n) {
  auto t = torch::empty({n}, torch::kFloat64);
  std::ifstream f(path, std::ios::binary);
  if (!f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes())))
    ADD_FAILURE() << "cannot read " << path;
  return t;
}

// Runs `workers` workers with `extra` arguments; each rank's weights (empty
// when the job failed, which is reported).
std::vector<torch::Tensor> launch(int workers, const std::string& optimizer,
                                  const std::vector<std::string>& extra) {
  const fs::path dir = fs::temp_directory_path() / ("pp_dopt_sparse_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<std::string> argv = pushpull::test::launch_self(
      workers, {"--sparse-worker", "--optimizer", optimizer, "--workers", std::to_string(workers),
                "--out-dir", dir.string()});
  argv.insert(argv.end(), extra.begin(), extra.end());
  std::vector<torch::Tensor> out;
  {
    pushpull::test::ChildProcess child(argv);  // its destructor stops it if still running
    auto rc = child.wait(std::chrono::seconds(180));
    EXPECT_TRUE(rc.has_value() && *rc == 0) << "workers failed or hung:\n" << child.output();
    const int64_t n = reference(optimizer, 1, {0}).numel();
    if (rc.has_value() && *rc == 0)
      for (int r = 0; r < workers; ++r)
        out.push_back(read_weights(dir / ("rank" + std::to_string(r) + ".bin"), n));
  }
  fs::remove_all(dir);
  return out;
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  const double err = (got - want).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  EXPECT_LE(err, 1e-5 * scale) << what << ": max error " << err << " for values up to " << scale;
}

// (optimizer, sparse_as_dense)
class LaunchedSparse : public testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(LaunchedSparse, TwoRanksMatchOneProcessOnTheUnionBatch) {
  const auto [optimizer, as_dense] = GetParam();
  std::vector<std::string> extra;
  if (as_dense) extra.push_back("--sparse-as-dense");
  const auto got = launch(2, optimizer, extra);
  ASSERT_EQ(got.size(), 2u);
  const auto want = reference(optimizer, 2, {0, 1});
  for (int r = 0; r < 2; ++r)
    expect_close(got[r], want, std::string(optimizer) + " rank " + std::to_string(r));
  // The ranks' shards differ, so a rank on its own gradients would not match.
  EXPECT_GT((reference(optimizer, 2, {0}) - want).abs().max().item<double>(), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Paths, LaunchedSparse,
                         testing::Values(std::tuple{std::string("sgd"), false},
                                         std::tuple{std::string("adagrad"), false},
                                         std::tuple{std::string("adagrad"), true}),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) ? "_sparse_as_dense" : "_allgather");
                         });

// A process set {0, 2} of 3 ranks: its members allgather among themselves
// and average over 2; rank 1, outside, steps alone on its own shard.
TEST(LaunchedSparseProcessSet, MembersMatchTheirUnionRankOneStepsAlone) {
  const auto got = launch(3, "sgd", {"--process-set", "0,2"});
  ASSERT_EQ(got.size(), 3u);
  const auto members = reference("sgd", 3, {0, 2});
  expect_close(got[0], members, "rank 0");
  expect_close(got[2], members, "rank 2");
  expect_close(got[1], reference("sgd", 3, {1}), "rank 1 (outside the set)");
}

// In process, a world of one: both paths step as the plain optimizer, and the
// gradient the optimizer sees is sparse.
TEST(SparseWorldOfOne, BothPathsMatchThePlainOptimizer) {
  Session session{pushpull::Options{}};
  for (const char* optimizer : {"sgd", "adagrad"}) {
    const auto want = reference(optimizer, 1, {0});
    for (bool as_dense : {false, true}) {
      const auto got = train(session.communicator(), optimizer, 1, {.sparse_as_dense = as_dense});
      expect_close(got, want, std::string(optimizer) + (as_dense ? " sparse_as_dense" : ""));
    }
  }
}

// Two backward passes of the same batch per step, averaged: the accumulated
// sparse gradient (the passes' concatenation) is divided by 2, so the steps
// are the plain optimizer's on one pass (Adagrad's step depends on the scale).
TEST(SparseWorldOfOne, AccumulatedPassesAreAveraged) {
  Session session{pushpull::Options{}};
  const auto want = reference("adagrad", 1, {0});
  for (bool as_dense : {false, true}) {
    const auto got = train(session.communicator(), "adagrad", 1,
                           {.backward_passes_per_step = 2,
                            .average_aggregated_gradients = true,
                            .sparse_as_dense = as_dense});
    expect_close(got, want, as_dense ? "sparse_as_dense" : "allgather");
  }
}

// A parameter with a sparse gradient in one step and none in the next
// contributes an empty sparse gradient (the name other ranks would submit).
TEST(SparseWorldOfOne, AnUnusedSparseParameterContributesAnEmptySparseGradient) {
  Session session{pushpull::Options{}};
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(kLr));
  DistributedOptimizer opt(sgd, named(net->named_parameters()), session.communicator());
  loss_of(net, torch::zeros({2, kLen}, torch::kLong), torch::zeros({2}, torch::kLong)).backward();
  opt.step();
  const auto after_first = net->emb->weight.detach().clone();
  net->emb->weight.mutable_grad() = torch::Tensor();  // unused from here on
  net->lin->weight.mutable_grad() = torch::Tensor();
  net->lin->bias.mutable_grad() = torch::Tensor();
  net->lin->forward(torch::ones({2, kDim})).sum().backward();
  opt.synchronize();
  ASSERT_TRUE(net->emb->weight.grad().is_sparse());
  EXPECT_EQ(net->emb->weight.grad()._nnz(), 0);
  opt.step();
  EXPECT_TRUE(torch::equal(net->emb->weight.detach(), after_first));
}

// The brief asked for InvalidArgument naming the parameter when a sparse
// gradient meets op kMin; the reducer refuses kMin (and every op but kAverage
// and kSum) at construction already, for every parameter, so that is where
// a sparse model meets it.
TEST(SparseWorldOfOne, OpMinIsRefusedAtConstruction) {
  Session session{pushpull::Options{}};
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(kLr));
  try {
    DistributedOptimizer opt(sgd, named(net->named_parameters()), session.communicator(),
                             {.op = pushpull::collective::Reduction::kMin});
    ADD_FAILURE() << "op kMin accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("op must be average or sum"), std::string::npos)
        << e.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--sparse-worker") return sparse_worker(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
