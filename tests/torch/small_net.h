// SPDX-License-Identifier: Apache-2.0
// The small network and data of the Trainer and DistributedOptimizer tests
// (trainer_fixture.h, dopt_fixture.h): a conv net seeded per replica or
// rank, union batches the same in every process, copies of parameters,
// and the check that weights match a reference.
// Every function returns fresh tensors; no shared state beyond torch's
// global seed, which make_model and make_data set.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace small_net {

inline constexpr int kSteps = 4;
inline constexpr int kShard = 6;  // samples per shard (a worker's or a device's) per step
inline constexpr double kLr = 0.5;
inline constexpr uint64_t kDataSeed = 7;

inline torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 3, 3)),
                               torch::nn::Tanh(), torch::nn::Flatten(),
                               torch::nn::Linear(3 * 6 * 6, 10));
}

// Union batches of `shards` x kShard samples, the same in every process.
struct Data {
  std::vector<torch::Tensor> x, y;
};
inline Data make_data(int shards) {
  torch::manual_seed(kDataSeed);
  Data d;
  for (int s = 0; s < kSteps; ++s) {
    d.x.push_back(torch::randn({shards * kShard, 1, 8, 8}));
    d.y.push_back(torch::randint(0, 10, {shards * kShard}, torch::kLong));
  }
  return d;
}

inline std::vector<torch::Tensor> clone_all(const std::vector<torch::Tensor>& ps) {
  std::vector<torch::Tensor> out;
  for (const auto& p : ps)
    out.push_back(p.detach().clone());
  return out;
}

// max |a - ref| <= tolerance * max |ref|, per tensor.
inline void expect_close(const std::vector<torch::Tensor>& got,
                         const std::vector<torch::Tensor>& ref, const std::string& what,
                         double tolerance = 1e-5) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), ref[i].sizes()) << what << " parameter " << i;
    const double err = (got[i] - ref[i]).abs().max().item<double>();
    const double scale = ref[i].abs().max().item<double>();
    EXPECT_LE(err, tolerance * scale)
        << what << " parameter " << i << ": max error " << err << " for values up to " << scale;
  }
}

}  // namespace small_net
