// SPDX-License-Identifier: Apache-2.0
// DistributedOptimizer with a sparse gradient (an nn::Embedding with
// sparse(true) beside a dense Linear) that a rank does not get in a step.
//
// Launched (this binary in --missing-worker mode under `pushpull launch -n 2
// -s 0`, stall shutdown 5 s): where every rank knows the parameter is sparse
// (declared through sparse_parameters(*model) or by name, or reduced as
// sparse on every rank in an earlier step), the rank without a gradient
// contributes an empty sparse one and after kSteps both ranks hold the
// weights of one plain process stepping on the mean of the two ranks'
// losses (what each rank used); where no rank can know (undeclared, first
// step), every rank's step() fails with InvalidArgument naming the parameter
// in under 4 s (before the fix: both waited for each other until the stall
// shutdown), and the collectives still work after it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "pushpull/collective.h"
#include "pushpull/error.h"
#include "pushpull/frontend/gradient_reducer.h"
#include "pushpull/torch/distributed_optimizer.h"
#include "sparse_gradients.h"  // integrations/torch/src: explain_mismatch
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

constexpr int kRanks = 2;

// Whether rank r uses the embedding in step s. "first": rank 1 not in step
// 0 (its first); "later": every rank in step 0, rank 1 not in step 1; both:
// rank 0 not in step 2.
bool uses(const std::string& pattern, int s, int r) {
  if (s == 2 && r == 0) return false;
  return !(r == 1 && s == (pattern == "first" ? 0 : 1));
}

// Rank r's loss in step s (the same data in every process): through the
// embedding when it uses it, else through the Linear alone on ones.
torch::Tensor loss_of(Net& net, const std::string& pattern, int s, int r) {
  torch::manual_seed(100 + 10 * s + r);
  const auto x = torch::randint(0, kVocab, {kShard, kLen}, torch::kLong);
  const auto y = torch::randint(0, 3, {kShard}, torch::kLong);
  const auto features = uses(pattern, s, r) ? net->emb(x).mean(1) : torch::ones({kShard, kDim});
  return torch::nn::functional::cross_entropy(net->lin(features), y);
}

// Gradients undefined, as after zero_grad(set_to_none) (libtorch 1.13's
// zero_grad() keeps them): an unused parameter then has none.
void clear_grads(Net& net) {
  for (auto& p : net->parameters())
    p.mutable_grad() = torch::Tensor();
}

// One process: SGD on the mean of the ranks' losses (the average of their gradients).
torch::Tensor reference(const std::string& pattern) {
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(kLr));
  for (int s = 0; s < kSteps; ++s) {
    clear_grads(net);
    ((loss_of(net, pattern, s, 0) + loss_of(net, pattern, s, 1)) / kRanks).backward();
    sgd.step();
  }
  return flat(net);
}

// kSteps steps on this rank; the weights after them.
torch::Tensor train(Communicator& comm, const std::string& pattern, const std::string& declare) {
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(kLr));
  DistributedOptimizerOptions options;
  if (declare == "module") options.sparse_parameters = pushpull::torch::sparse_parameters(*net);
  if (declare == "name") options.sparse_parameters = {"emb.weight"};
  DistributedOptimizer opt(sgd, named(net->named_parameters()), comm, options);
  for (int s = 0; s < kSteps; ++s) {
    clear_grads(net);
    loss_of(net, pattern, s, comm.rank()).backward();
    opt.step();
  }
  return flat(net);
}

// Undeclared, unused on rank 1 in its first step: every rank's step() throws
// InvalidArgument naming the parameter and the cures, quickly; the
// collectives work after it. Throws otherwise.
void expect_clear_error(Communicator& comm) {
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(kLr));
  DistributedOptimizer opt(sgd, named(net->named_parameters()), comm);
  comm.barrier();  // the ranks start together: the time below is the error's
  const auto t0 = std::chrono::steady_clock::now();
  std::string what;
  try {
    loss_of(net, "first", 0, comm.rank()).backward();
    opt.step();
  } catch (const InvalidArgument& e) {
    what = e.what();
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("rank %d: error after %.3f s: %s\n", comm.rank(), took, what.c_str());
  for (const char* needle : {"parameter 'emb.weight'", "sparse_as_dense", "sparse_parameters",
                             "give every rank a gradient", "submitted differently"}) {
    if (what.find(needle) == std::string::npos)
      throw std::runtime_error(std::string("the error lacks \"") + needle + "\": " + what);
  }
  if (took >= 4.0) throw std::runtime_error("the error took " + std::to_string(took) + " s");
  comm.barrier();
}

int missing_worker(int argc, char** argv) {
  CLI::App app("torch_dopt_sparse_missing_test worker");
  bool unused = false, expect_error = false;
  std::string pattern = "first", declare = "none", out_dir;
  app.add_flag("--missing-worker", unused);
  app.add_flag("--expect-error", expect_error);
  app.add_option("--pattern", pattern);
  app.add_option("--declare", declare);
  app.add_option("--out-dir", out_dir);
  CLI11_PARSE(app, argc, argv);
  try {
    torch::set_num_threads(1);
    auto options = pushpull::Options::from_env();
    options.collective.stall_shutdown_seconds = 5;  // a hang becomes a failure
    Session session(options);
    if (expect_error) {
      expect_clear_error(session.communicator());
      std::printf("PASS error rank %d\n", session.rank());
      return 0;
    }
    const auto w = train(session.communicator(), pattern, declare);
    std::ofstream f(out_dir + "/rank" + std::to_string(session.rank()) + ".bin", std::ios::binary);
    f.write(static_cast<const char*>(w.data_ptr()), static_cast<std::streamsize>(w.nbytes()));
    if (!f) throw pushpull::IoError("cannot write the weights");
    session.communicator().barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "missing worker failed: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Runs the 2 workers with `args`: their exit code (nullopt: hung) and output.
std::pair<std::optional<int>, std::string> launch(const std::vector<std::string>& args) {
  auto argv = pushpull::test::launch_self(kRanks, {"--missing-worker"});
  argv.insert(argv.end(), args.begin(), args.end());
  pushpull::test::ChildProcess child(argv);  // its destructor stops it if still running
  auto rc = child.wait(std::chrono::seconds(60));
  return {rc, child.output()};
}

void expect_training_matches(const std::string& pattern, const std::string& declare) {
  pushpull::test::TempDir dir("pp-dopt-missing");
  const auto [rc, out] =
      launch({"--pattern", pattern, "--declare", declare, "--out-dir", dir.path});
  ASSERT_TRUE(rc.has_value() && *rc == 0) << "workers failed or hung:\n" << out;
  const auto want = reference(pattern);
  for (int r = 0; r < kRanks; ++r) {
    auto got = torch::empty({want.numel()}, torch::kFloat64);
    std::ifstream f(fs::path(dir.path) / ("rank" + std::to_string(r) + ".bin"), std::ios::binary);
    ASSERT_TRUE(f.read(static_cast<char*>(got.data_ptr()), got.nbytes())) << "rank " << r;
    const double err = (got - want).abs().max().item<double>();
    EXPECT_LE(err, 1e-5 * want.abs().max().item<double>()) << "rank " << r << " of " << pattern;
  }
}

TEST(LaunchedSparseMissing, DeclaredByTheModuleUnusedInTheFirstStepTrainsOn) {
  expect_training_matches("first", "module");
}

TEST(LaunchedSparseMissing, DeclaredByNameUnusedInTheFirstStepTrainsOn) {
  expect_training_matches("first", "name");
}

TEST(LaunchedSparseMissing, ReducedAsSparseOnceThenUnusedTrainsOn) {
  expect_training_matches("later", "none");
}

TEST(LaunchedSparseMissing, UndeclaredUnusedInTheFirstStepFailsEveryRankAtOnce) {
  const auto [rc, out] = launch({"--expect-error"});
  ASSERT_TRUE(rc.has_value() && *rc == 0) << "workers failed or hung:\n" << out;
  for (int r = 0; r < kRanks; ++r)
    EXPECT_NE(out.find("PASS error rank " + std::to_string(r)), std::string::npos) << out;
}

// The module helper finds sparse Embedding / EmbeddingBag weights by the
// names named_parameters() gives, and skips dense ones.
TEST(SparseParameters, NamesTheSparseEmbeddingWeights) {
  struct Model : torch::nn::Module {
    Model() {
      register_module("net", make_net().ptr());
      register_module("bag",
                      torch::nn::EmbeddingBag(torch::nn::EmbeddingBagOptions(5, 2).sparse(true)));
      register_module("dense", torch::nn::Embedding(torch::nn::EmbeddingOptions(5, 2)));
    }
  } model;
  const auto names = pushpull::torch::sparse_parameters(model);
  EXPECT_EQ(names, (std::vector<std::string>{"net.emb.weight", "bag.weight"}));
  for (const auto& name : names)
    EXPECT_TRUE(model.named_parameters().contains(name)) << name;
}

// In a world of one: a declared parameter unused in its first step gets an
// empty sparse gradient; a declared name that is no parameter is refused.
TEST(SparseParameters, DeclaredUnusedGetsAnEmptySparseGradientAndBadNamesAreRefused) {
  Session session{pushpull::Options{}};
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(kLr));
  try {
    DistributedOptimizer bad(sgd, named(net->named_parameters()), session.communicator(),
                             {.sparse_parameters = {"emb.wieght"}});
    ADD_FAILURE() << "an unknown sparse_parameters name was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'emb.wieght'"), std::string::npos) << e.what();
  }
  DistributedOptimizer opt(sgd, named(net->named_parameters()), session.communicator(),
                           {.sparse_parameters = pushpull::torch::sparse_parameters(*net)});
  const auto before = net->emb->weight.detach().clone();
  net->lin->forward(torch::ones({2, kDim})).sum().backward();
  opt.synchronize();
  ASSERT_TRUE(net->emb->weight.grad().is_sparse());
  EXPECT_EQ(net->emb->weight.grad()._nnz(), 0);
  opt.step();
  EXPECT_TRUE(torch::equal(net->emb->weight.detach(), before));
}

// The explanation replaces only the negotiation's error about a guessed
// parameter whose ranks sent sparse rows and another op; anything else
// (another parameter, two shapes of a dense one, other errors) passes as is.
TEST(SparseParameters, OnlyASparseDenseMismatchOfAGuessedParameterIsExplained) {
  using pushpull::torch::detail::explain_mismatch;
  using pushpull::torch::detail::Guess;
  Session session{pushpull::Options{}};
  pushpull::frontend::GradientReducer reducer(session.communicator(), {"a", "emb"},
                                              {.name_prefix = "g."});
  const auto error = [](const std::string& name, const std::string& ops) {
    return std::make_exception_ptr(InvalidArgument("collective: tensor '" + name +
                                                   "' was submitted differently by the "
                                                   "ranks (" +
                                                   ops + "); every rank must submit the same op"));
  };
  const std::string kinds = "rank 0: allgather uint8(3, 24); rank 1: allreduce float32(40, 4) sum";
  const auto text_of = [](std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return std::string(x.what());
    }
  };
  const std::vector<Guess> zeros{Guess::kNone, Guess::kDenseZeros};
  const auto explained = text_of(explain_mismatch(error("g.emb", kinds), zeros, reducer));
  EXPECT_NE(explained.find("parameter 'emb'"), std::string::npos) << explained;
  EXPECT_NE(explained.find("contributed dense zeros"), std::string::npos) << explained;
  EXPECT_NE(explained.find(kinds), std::string::npos) << "the cause is kept: " << explained;
  const auto sparse =
      text_of(explain_mismatch(error("g.emb", kinds), {Guess::kNone, Guess::kSparse}, reducer));
  EXPECT_NE(sparse.find("contributed a sparse gradient"), std::string::npos) << sparse;
  for (const auto& [e, guessed] : std::vector<std::pair<std::exception_ptr, std::vector<Guess>>>{
           {error("g.emb", kinds), {Guess::kNone, Guess::kNone}},  // known, not guessed
           {error("g.a", kinds), zeros},                           // another parameter
           {error("g.emb", "rank 0: allreduce float32(4); rank 1: allreduce float32(5)"), zeros},
           {std::make_exception_ptr(pushpull::Timeout("tensor 'g.emb' stalled")), zeros}}) {
    EXPECT_EQ(explain_mismatch(e, guessed, reducer), e) << text_of(e);
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--missing-worker") return missing_worker(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
