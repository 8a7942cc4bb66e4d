// SPDX-License-Identifier: Apache-2.0
// What the Trainer tests share (trainer_tests.cpp, trainer_unit_tests.cpp;
// one binary): the small network and data (small_net.h), the summed loss,
// and plain libtorch SGD on the union batch as the reference. Every function
// returns fresh tensors; no shared state beyond torch's global seed.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/kvstore.h"
#include "pushpull/torch/replicas.h"
#include "pushpull/torch/trainer.h"
#include "small_net.h"

namespace trainer_test {

using namespace small_net;
using pushpull::InvalidArgument;
using pushpull::KVStore;
using pushpull::OptimizerSpec;
using pushpull::torch::ReplicaRunner;
using pushpull::torch::Trainer;
using pushpull::torch::TrainerOptions;
using Replicas = std::vector<pushpull::torch::ParameterList>;

inline torch::Tensor loss_sum(torch::nn::Sequential& m, const torch::Tensor& x,
                              const torch::Tensor& y) {
  namespace F = torch::nn::functional;
  return F::cross_entropy(m->forward(x), y, F::CrossEntropyFuncOptions().reduction(torch::kSum));
}

// Plain libtorch SGD on the union batch, from the weights of make_model(1).
inline std::vector<torch::Tensor> reference_weights(int shards) {
  auto model = make_model(1);
  const Data data = make_data(shards);
  for (int s = 0; s < kSteps; ++s) {
    model->zero_grad();
    loss_sum(model, data.x[s], data.y[s]).backward();
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      p.sub_(p.grad() * (kLr / (shards * kShard)));
  }
  return clone_all(model->parameters());
}

}  // namespace trainer_test
