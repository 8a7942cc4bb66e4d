// SPDX-License-Identifier: Apache-2.0
// Trainer's implementation: libtorch's glue around frontend::TrainerCore
// (include/pushpull/frontend/trainer_core.h), which holds the step itself
// (keys, init, pushes, the rescale, the local update) for both torch front
// ends. Here: the tensors' checks and messages, the autograd hooks.
// Private to integrations/torch/src.
//
// Thread safety: see trainer.h (the core guards the round's state).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pushpull/frontend/trainer_core.h"
#include "pushpull/torch/trainer.h"

namespace pushpull::torch {

struct Trainer::Impl {
  Impl(std::vector<ParameterList> reps, OptimizerSpec s, KVStore& store, TrainerOptions o);
  ~Impl();

  void check_parameters() const;
  // How messages name parameter i's key: "key 3", or "packed in key 2".
  std::string key_label(size_t i) const;
  void install_hooks();
  void on_grad_ready(size_t i, int d);
  // Parameter i's gradient on replica d, checked.
  const at::Tensor& checked_gradient(size_t i, int d) const;

  // What the core asks of libtorch.
  struct Tensors final : frontend::TrainerTensors {
    Impl* self = nullptr;
    ArrayView weight(size_t i, int d) override;
    ArrayView gradient(size_t i, int d) override;
    void batch_changed(int64_t batch, int64_t first_batch, int workers) override;
  };

  KVStore& kv;
  TrainerOptions opt;
  std::vector<ParameterList> replicas;
  size_t n = 0;
  int k = 0;
  bool warned_batch = false;
  Tensors tensors;                              // before core: it outlives it
  std::unique_ptr<frontend::TrainerCore> core;  // after the checks

  struct Hook {
    std::shared_ptr<::torch::autograd::Node> accumulator;  // kept alive so the hook stays
    uintptr_t id = 0;
  };
  std::vector<Hook> hooks;
};

}  // namespace pushpull::torch
