// SPDX-License-Identifier: Apache-2.0
// pushpull::torch::sparse_parameters: the parameters a model's modules say
// have sparse gradients (declared in distributed_optimizer.h).
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>

#include "pushpull/torch/distributed_optimizer.h"

namespace pushpull::torch {

namespace {

bool sparse_embedding(const ::torch::nn::Module& m) {
  if (const auto* e = m.as<::torch::nn::EmbeddingImpl>()) return e->options.sparse();
  if (const auto* b = m.as<::torch::nn::EmbeddingBagImpl>()) return b->options.sparse();
  return false;
}

}  // namespace

std::vector<std::string> sparse_parameters(const ::torch::nn::Module& module) {
  std::vector<std::string> names;
  if (sparse_embedding(module)) names.push_back("weight");
  // Without the module itself: named_modules() would need it in a shared_ptr.
  // The others are named as named_parameters() prefixes their parameters
  // ("emb" -> "emb.weight").
  for (const auto& item : module.named_modules("", /*include_self=*/false))
    if (sparse_embedding(*item.value())) names.push_back(item.key() + ".weight");
  return names;
}

}  // namespace pushpull::torch
