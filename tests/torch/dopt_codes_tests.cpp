// SPDX-License-Identifier: Apache-2.0
// DistributedOptimizer with Compression::kTwoBit / kOneBit: each rank encodes
// its gradient with its own residual, the codes are allgathered and every
// rank sums them in rank order.
//
// The launched case runs 3 workers (this binary in --codes-worker mode under
// `pushpull launch -n 3 -s 0`) on a linear loss sum(w * c) whose gradient is
// c whatever w is, so the weights after the steps follow from a scalar model
// of the codecs (written here, not the codecs under test) with every rank's
// residual carried across steps; every rank must end with the same bits.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <cmath>
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

using pushpull::collective::Communicator;
using pushpull::collective::Session;
using pushpull::torch::Compression;
using pushpull::torch::DistributedOptimizer;
namespace fs = std::filesystem;

constexpr int kSteps = 3;
constexpr int64_t kValues = 101;  // 3 words of 1bit codes, the last partial
constexpr float kThreshold = 0.5f;

// Rank r's gradient at step s, element i: every code of both types shows up.
float grad_at(int r, int s, int64_t i) {
  return static_cast<float>((i * 7 + r * 3 + s * 5) % 11 - 5) * 0.15f;
}

torch::Tensor grads(int r, int s) {
  auto t = torch::empty({kValues}, torch::kFloat);
  for (int64_t i = 0; i < kValues; ++i)
    t[i] = grad_at(r, s, i);
  return t;
}

Compression compression_of(const std::string& type) {
  return type == "2bit" ? Compression::kTwoBit : Compression::kOneBit;
}

// The scalar model of one rank's codec (docs/kvstore.md "Gradient compression").
float model_send(const std::string& type, float& r, float g) {
  r += g;
  float q;
  if (type == "2bit")
    q = r >= kThreshold ? kThreshold : (r <= -kThreshold ? -kThreshold : 0.0f);
  else
    q = r > kThreshold ? 1.0f : -1.0f;
  r -= q;
  return q;
}

// SGD (lr 1) from zeros on the average of the codes of `ranks` (in rank
// order), step by step.
std::vector<float> model_weights(const std::string& type, const std::vector<int>& ranks) {
  const auto n = static_cast<int>(ranks.size());
  std::vector<std::vector<float>> res(n, std::vector<float>(kValues, 0.0f));
  std::vector<float> w(kValues, 0.0f);
  for (int s = 0; s < kSteps; ++s)
    for (int64_t i = 0; i < kValues; ++i) {
      float sum = 0.0f;
      for (int k = 0; k < n; ++k)
        sum += model_send(type, res[k][i], grad_at(ranks[k], s, i));
      w[i] -= sum * static_cast<float>(1.0 / n);
    }
  return w;
}

// Plain SGD (lr 1) of rank r alone, uncompressed (a rank outside the set).
std::vector<float> alone_weights(int r) {
  std::vector<float> w(kValues, 0.0f);
  for (int s = 0; s < kSteps; ++s)
    for (int64_t i = 0; i < kValues; ++i)
      w[i] -= grad_at(r, s, i);
  return w;
}

// kSteps steps of DistributedOptimizer(SGD lr 1) over w (from zeros).
torch::Tensor train(Communicator& comm, const std::string& type, std::vector<int> set = {}) {
  auto w = torch::zeros({kValues}, torch::requires_grad());
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(1.0));
  DistributedOptimizer opt(sgd, {{"w", w}}, comm,
                           {.compression = compression_of(type),
                            .process_set = std::move(set),
                            .compression_threshold = kThreshold});
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    (w * grads(comm.rank(), s)).sum().backward();
    opt.step();
  }
  return w.detach().clone();
}

int codes_worker(int argc, char** argv) {
  CLI::App app("torch_dopt_codes_test worker");
  bool unused = false;
  std::string type, out_dir;
  std::vector<int> set;
  app.add_flag("--codes-worker", unused);
  app.add_option("--type", type)->required();
  app.add_option("--out-dir", out_dir)->required();
  app.add_option("--process-set", set)->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  try {
    torch::set_num_threads(1);
    Session session(pushpull::Options::from_env());
    auto w = train(session.communicator(), type, set);
    std::ofstream f(out_dir + "/rank" + std::to_string(session.rank()) + ".bin", std::ios::binary);
    f.write(static_cast<const char*>(w.data_ptr()), static_cast<std::streamsize>(w.nbytes()));
    if (!f) throw pushpull::IoError("cannot write the weights");
    session.communicator().barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "codes worker failed: %s\n", e.what());
    return 1;
  }
  return 0;
}

std::vector<float> read_weights(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<float> w(kValues);
  if (!f.read(reinterpret_cast<char*>(w.data()), kValues * sizeof(float)))
    ADD_FAILURE() << "cannot read " << path;
  return w;
}

// Runs 3 workers with `extra` arguments; returns each rank's weights (empty
// when the job failed, which is reported).
std::vector<std::vector<float>> launch_3(const std::string& type,
                                         const std::vector<std::string>& extra) {
  constexpr int kWorkers = 3;
  const fs::path dir =
      fs::temp_directory_path() / ("pp_dopt_codes_" + std::to_string(::getpid()) + "_" + type);
  fs::create_directories(dir);
  std::vector<std::string> argv = pushpull::test::launch_self(
      kWorkers, {"--codes-worker", "--type", type, "--out-dir", dir.string()});
  argv.insert(argv.end(), extra.begin(), extra.end());
  std::vector<std::vector<float>> out;
  {
    pushpull::test::ChildProcess child(argv);  // its destructor stops it if still running
    auto rc = child.wait(std::chrono::seconds(180));
    EXPECT_TRUE(rc.has_value() && *rc == 0) << "workers failed or hung:\n" << child.output();
    if (rc.has_value() && *rc == 0)
      for (int r = 0; r < kWorkers; ++r)
        out.push_back(read_weights(dir / ("rank" + std::to_string(r) + ".bin")));
  }
  fs::remove_all(dir);
  return out;
}

class LaunchedCodes : public testing::TestWithParam<const char*> {};

TEST_P(LaunchedCodes, EveryRankStepsOnTheModelsAverageOfAllCodes) {
  const std::string type = GetParam();
  const auto got = launch_3(type, {});
  ASSERT_EQ(got.size(), 3u);
  const std::vector<float> want = model_weights(type, {0, 1, 2});
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_EQ(got[r], got[0]) << "rank " << r << " differs from rank 0";
    for (int64_t i = 0; i < kValues; ++i)
      ASSERT_NEAR(got[r][i], want[i], 1e-6) << type << " rank " << r << " element " << i;
  }
}

// A process set {0, 2}: its members average their two ranks' codes (rank 1's
// gradient never counts); rank 1, outside, steps alone on its own gradient.
TEST_P(LaunchedCodes, AProcessSetSumsItsMembersCodesOnly) {
  const std::string type = GetParam();
  const auto got = launch_3(type, {"--process-set", "0,2"});
  ASSERT_EQ(got.size(), 3u);
  const std::vector<float> members = model_weights(type, {0, 2}), alone = alone_weights(1);
  EXPECT_EQ(got[2], got[0]);
  for (int64_t i = 0; i < kValues; ++i) {
    ASSERT_NEAR(got[0][i], members[i], 1e-6) << type << " member, element " << i;
    ASSERT_NEAR(got[1][i], alone[i], 1e-6) << type << " rank 1 (outside), element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, LaunchedCodes, testing::Values("2bit", "1bit"));

// In process, a world of one: its own codes are the sum, residual included.
TEST(CodesWorldOfOne, StepsOnItsOwnCodesAndRefusesBadThresholds) {
  Session session{pushpull::Options{}};
  for (const char* type : {"2bit", "1bit"}) {
    const auto w = train(session.communicator(), type);
    const std::vector<float> want = model_weights(type, {0});
    for (int64_t i = 0; i < kValues; ++i)
      ASSERT_EQ(w[i].item<float>(), want[i]) << type << " element " << i;
  }
  auto w = torch::zeros({4}, torch::requires_grad());
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(1.0));
  for (auto [c, t] :
       {std::pair{Compression::kTwoBit, 0.0f}, std::pair{Compression::kOneBit, std::nanf("")}}) {
    try {
      DistributedOptimizer opt(sgd, {{"w", w}}, session.communicator(),
                               {.compression = c, .compression_threshold = t});
      ADD_FAILURE() << "threshold " << t << " accepted";
    } catch (const pushpull::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("threshold"), std::string::npos) << e.what();
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--codes-worker") return codes_worker(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
