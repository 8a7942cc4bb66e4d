// SPDX-License-Identifier: Apache-2.0
// What the pieces of torch_distributed_optimizer_test share
// (distributed_optimizer_tests.cpp, dopt_worker.cpp,
// dopt_world_of_one_tests.cpp; one binary): the small network and data
// (small_net.h), the mean loss, tensor files (how a launched worker hands its
// results to the test), and the worker mode main() runs. Every function
// returns fresh values; no shared state beyond torch's global seed.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "pushpull/collective.h"
#include "pushpull/error.h"
#include "pushpull/torch/distributed_optimizer.h"
#include "small_net.h"

namespace dopt_test {

using namespace small_net;
using pushpull::InvalidArgument;
using pushpull::collective::Communicator;
using pushpull::collective::Session;
using pushpull::torch::broadcast_optimizer_state;
using pushpull::torch::broadcast_parameters;
using pushpull::torch::DistributedOptimizer;
using pushpull::torch::DistributedOptimizerOptions;
using pushpull::torch::named;
namespace fs = std::filesystem;

// The mean loss: the allreduce averages over the workers.
inline torch::Tensor loss_mean(torch::nn::Sequential& m, const torch::Tensor& x,
                               const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(m->forward(x), y);
}

inline void write_tensors(const std::string& path, const std::vector<torch::Tensor>& ts) {
  std::ofstream f(path, std::ios::binary);
  for (const auto& t : ts) {
    auto c = t.detach().to(torch::kFloat64).contiguous();
    const int64_t n = c.numel();
    f.write(reinterpret_cast<const char*>(&n), sizeof n);
    f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  }
  if (!f) throw pushpull::IoError("cannot write " + path);
}

inline std::vector<torch::Tensor> read_tensors(const std::string& path) {
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

// The worker of the launched tests (dopt_worker.cpp): this binary under
// `pushpull launch -s 0` with --dopt-worker; returns its exit code.
int dopt_worker(int argc, char** argv);

}  // namespace dopt_test
