// SPDX-License-Identifier: Apache-2.0
// Smoke test of the reference job: examples/lenet trains a few hundred steps on
// Fashion-MNIST (2 devices, local store) and must end well above chance (0.1).
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>

#include "support/process.h"

namespace {

constexpr const char* kDataDir = "/usr/share/datasets/fashion-mnist";

double final_accuracy(const std::string& output) {
  // The summary line of worker 0: "lenet summary: ... test_accuracy=0.8123 ...".
  std::smatch m;
  static const std::regex re("lenet summary:.*test_accuracy=([0-9.]+)");
  if (!std::regex_search(output, m, re)) return -1;
  return std::stod(m[1].str());
}

void run_lenet(const std::vector<std::string>& extra, double min_accuracy) {
  if (!std::filesystem::exists(std::string(kDataDir) + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed in " << kDataDir
                 << " (Debian package dataset-fashion-mnist, `make deps`)";
  }
  std::vector<std::string> argv = {std::string(PUSHPULL_BIN_DIR) + "/lenet",
                                   "--kvstore",
                                   "local",
                                   "--epochs",
                                   "1",
                                   "--max-batches",
                                   "300",
                                   "--test-limit",
                                   "2000",
                                   "--batch-size",
                                   "32",
                                   "--lr",
                                   "0.05",
                                   "--log-every",
                                   "100",
                                   "--threads",
                                   "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  pushpull::test::ChildProcess child(argv);
  auto rc = child.wait(std::chrono::seconds(400));
  ASSERT_TRUE(rc.has_value()) << "lenet did not finish in 400 s:\n" << child.output();
  ASSERT_EQ(*rc, 0) << child.output();
  const double acc = final_accuracy(child.output());
  ASSERT_GE(acc, 0) << "no summary line in:\n" << child.output();
  EXPECT_GT(acc, min_accuracy) << child.output();
}

TEST(LenetSmoke, TwoDevicesStoreUpdateLearns) {
  run_lenet({"--devices-per-worker", "2"}, 0.6);
}

TEST(LenetSmoke, LocalUpdateLearns) {
  run_lenet({"--devices-per-worker", "1", "--update-on-kvstore", "false"}, 0.6);
}

// --mode horovod: two processes through `pushpull launch -s 0`, each with
// torch::optim::SGD wrapped in DistributedOptimizer; both end with the same
// test accuracy (identical weights), well above chance.
void run_horovod_mode(const std::vector<std::string>& extra) {
  if (!std::filesystem::exists(std::string(kDataDir) + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed in " << kDataDir;
  }
  std::vector<std::string> argv({std::string(PUSHPULL_BIN_DIR) + "/pushpull",
                                 "launch",
                                 "-n",
                                 "2",
                                 "-s",
                                 "0",
                                 "--timeout",
                                 "120",
                                 "--",
                                 std::string(PUSHPULL_BIN_DIR) + "/lenet",
                                 "--mode",
                                 "horovod",
                                 "--epochs",
                                 "1",
                                 "--max-batches",
                                 "150",
                                 "--batch-size",
                                 "32",
                                 "--test-limit",
                                 "2000",
                                 "--log-every",
                                 "50",
                                 "--threads",
                                 "1"});
  argv.insert(argv.end(), extra.begin(), extra.end());
  pushpull::test::ChildProcess child(argv);
  auto rc = child.wait(std::chrono::seconds(400));
  ASSERT_TRUE(rc.has_value()) << "lenet did not finish in 400 s:\n" << child.output();
  ASSERT_EQ(*rc, 0) << child.output();
  const double acc = final_accuracy(child.output());
  EXPECT_GT(acc, 0.6) << child.output();
  std::smatch m0, m1;
  // One prefix per line, the launcher's: lenet adds none of its own under it.
  static const std::regex w0(R"(\[worker 0\] epoch 0 done:.*test-acc ([0-9.]+))");
  static const std::regex w1(R"(\[worker 1\] epoch 0 done:.*test-acc ([0-9.]+))");
  const std::string out = child.output();
  ASSERT_TRUE(std::regex_search(out, m0, w0) && std::regex_search(out, m1, w1)) << out;
  EXPECT_EQ(out.find("] [worker"), std::string::npos) << "a doubled prefix:\n" << out;
  EXPECT_NE(out.find("[worker 1] worker 1 of 2: sync="), std::string::npos) << out;
  EXPECT_EQ(m0[1].str(), m1[1].str()) << "the workers' models differ:\n" << out;
}

TEST(LenetSmoke, HorovodModeTwoWorkersLearn) {
  run_horovod_mode({});
}

// The same with the gradients travelling as float16 (Compression.fp16).
TEST(LenetSmoke, HorovodModeFp16TwoWorkersLearn) {
  run_horovod_mode({"--compression", "fp16"});
}

// 2bit codes with error feedback (DistributedOptimizer's kTwoBit, codes
// allgathered and summed by every rank): momentum 0, as the codecs need
// (docs/kvstore.md "Choosing a threshold"), and a threshold near the size of
// the averaged gradients.
TEST(LenetSmoke, HorovodMode2bitTwoWorkersLearn) {
  run_horovod_mode({"--compression", "2bit", "--compression-threshold", "0.01", "--momentum", "0"});
}

}  // namespace
