// SPDX-License-Identifier: Apache-2.0
// The small model of the sparse-gradient DistributedOptimizer tests
// (dopt_sparse_tests.cpp, dopt_sparse_missing_tests.cpp): an nn::Embedding
// with sparse(true) beside a dense Linear, built from one seed in every
// process, and the helpers both compare weights with.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace sparse_net {

constexpr int kSteps = 4;
constexpr int kShard = 5;   // samples per rank per step
constexpr int kLen = 3;     // indices per sample
constexpr int kVocab = 40;  // rows of the embedding: most rows are untouched in a step
constexpr int kDim = 4;
constexpr double kLr = 0.5;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    emb = register_module(
        "emb", torch::nn::Embedding(torch::nn::EmbeddingOptions(kVocab, kDim).sparse(true)));
    lin = register_module("lin", torch::nn::Linear(kDim, 3));
  }
  torch::Tensor forward(const torch::Tensor& idx) { return lin(emb(idx).mean(1)); }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(Net);

// The same weights in every process.
inline Net make_net() {
  torch::manual_seed(3);
  return Net();
}

// Every parameter flattened into one float64 vector.
inline torch::Tensor flat(Net& net) {
  std::vector<torch::Tensor> ts;
  for (auto& p : net->parameters())
    ts.push_back(p.detach().flatten().to(torch::kFloat64));
  return torch::cat(ts);
}

}  // namespace sparse_net
