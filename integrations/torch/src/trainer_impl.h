// SPDX-License-Identifier: Apache-2.0
// Trainer's implementation, shared by trainer.cpp (construction, hooks,
// step) and trainer_keys.cpp (the store keys: packing, gradients in, results
// out). Private to integrations/torch/src.
//
// Thread safety: see trainer.h; the round state below is guarded by `mu`.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pushpull/frontend/push_schedule.h"
#include "pushpull/torch/trainer.h"

namespace pushpull::torch {
namespace trainer_detail {

std::string describe(const at::Tensor& t);
// Where a tensor sits, for messages: "parameter 3 (key 3) of replica 1", or
// "parameter 3 (packed in key 2) of replica 1".
std::string where(size_t i, const std::string& key_label, int d);
// The layout the store can read through data_ptr, or a message saying why not.
std::string layout_problem(const at::Tensor& t);
ArrayView view_of(const at::Tensor& t);

}  // namespace trainer_detail

struct Trainer::Impl {
  Impl(std::vector<ParameterList> reps, OptimizerSpec s, KVStore& store, TrainerOptions o);
  ~Impl();

  // A key of the store: one parameter, or several small ones packed in order
  // into flat buffers (their gradients copied in, the result copied out).
  struct Unit {
    Key key;
    std::vector<size_t> members;    // parameter indices, ascending
    std::vector<int64_t> offsets;   // packed: each member's first element in the buffers
    std::vector<at::Tensor> grads;  // packed: one flat gradient per replica
    // The pulled result when it does not land in the parameters themselves:
    // packed, the new weights (update_on_kvstore) or the summed gradient;
    // unpacked, the summed gradient (local update).
    at::Tensor value;
    at::Tensor weight;  // packed, local update: replica 0's weights, flat
    bool packed() const { return members.size() > 1; }
  };

  void check_parameters() const;
  void make_units();
  // How messages name parameter i's key: "key 3", or "packed in key 2".
  std::string key_label(size_t i) const;
  void install_hooks();
  void on_grad_ready(size_t i, int d);
  // Parameter i's gradient on replica d, checked.
  const at::Tensor& checked_gradient(size_t i, int d) const;
  // Unit u's gradients, one array per replica (checked; packed: copied into
  // its flat buffers).
  ArrayList gradients(size_t u);
  // Pushes unit u's gradients and pulls its result right behind
  // (pushpull_async): the new value (update_on_kvstore) into every replica,
  // else the summed gradient into the unit's value.
  KVHandle exchange(size_t u, const ArrayList& grads);
  ArrayList outputs(size_t u);
  // After unit u's exchange: the new weights into every replica.
  void finish(size_t u, int64_t global_batch);
  void apply_local_update(size_t u, int64_t global_batch);
  // Copies replica d's parameters of u (their values) into `flat`, or back.
  void gather(const Unit& u, int d, const at::Tensor& flat) const;
  void scatter(const Unit& u, const at::Tensor& flat, int d);
  void init();
  void step(int64_t batch_size);

  KVStore& kv;
  OptimizerSpec spec;
  TrainerOptions opt;
  std::vector<ParameterList> replicas;
  size_t n = 0;
  int k = 0;
  std::vector<Unit> units;
  std::vector<size_t> unit_of;                 // parameter -> its unit
  std::unique_ptr<Optimizer> local_optimizer;  // when !update_on_kvstore
  bool initialised = false;
  int64_t store_global_batch = 0;  // what the store's optimizer was scaled for
  bool warned_batch = false;

  // Round state, shared with the hooks (several backward threads).
  mutable std::mutex mu;
  // When a hook pushes which unit (frontend/push_schedule.h; its own lock).
  std::unique_ptr<frontend::PushSchedule> schedule;
  std::vector<KVHandle> handles;  // per unit: push handles of this round (mu)
  Stats stats;                    // (mu)

  struct Hook {
    std::shared_ptr<::torch::autograd::Node> accumulator;  // kept alive so the hook stays
    uintptr_t id = 0;
  };
  std::vector<Hook> hooks;
};

}  // namespace pushpull::torch
