// SPDX-License-Identifier: Apache-2.0
// Optimizers: MXNet's update rules (sgd, nag, adam, adagrad, rmsprop, test)
// with per-key state, shared by the local KVStore and the parameter servers.
//
// An optimizer is described by data only (OptimizerSpec: a name and numeric
// hyperparameters), so a worker can send it to servers as text:
//   OptimizerSpec::parse("sgd:learning_rate=0.1,momentum=0.9")
//
// Hyperparameters (defaults as in MXNet; any not listed for an optimizer is an
// InvalidArgument that lists the valid ones):
//   every optimizer: learning_rate, wd (0), rescale_grad (1),
//     clip_gradient (-1 = off), multi_precision (0)
//   sgd:     learning_rate 0.01, momentum 0
//   nag:     learning_rate 0.01, momentum 0
//   adam:    learning_rate 0.001, beta1 0.9, beta2 0.999, epsilon 1e-8
//   adagrad: learning_rate 0.01, epsilon 1e-7
//   rmsprop: learning_rate 0.001, gamma1 0.9, gamma2 0.9, epsilon 1e-8,
//            centered 0, clip_weights (-1 = off)
//   test:    weight += rescale_grad * grad (MXNet's test optimizer)
//
// Weights may be float32, float64, float16 or bfloat16 on the CPU. Updates are
// computed in float32 (float64 for float64 weights). With multi_precision=1, a
// float16/bfloat16 weight gets a float32 master copy in its state, so small
// updates accumulate instead of being rounded away.
//
// Thread safety: update() may run concurrently for different keys; calls for
// the same key must be serialised by the caller (the KVStore's per-key order
// does that). save_states/load_states must not run concurrently with update().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "pushpull/array.h"
#include "pushpull/key.h"

namespace pushpull {

struct OptimizerSpec {
  std::string name;
  std::map<std::string, double> hyperparameters;

  // "name" or "name:k=v,k=v" (spaces around tokens are ignored). Throws
  // InvalidArgument on malformed text (it does not check the names: see
  // create_optimizer).
  static OptimizerSpec parse(std::string_view text);
  // The inverse of parse: parse(s.to_string()) == s, every value exactly.
  std::string to_string() const;
  friend bool operator==(const OptimizerSpec&, const OptimizerSpec&) = default;
};

// Names of the optimizers create_optimizer knows, sorted.
std::vector<std::string> optimizer_names();

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  const std::string& name() const { return spec_.name; }
  // The spec with every hyperparameter present (defaults filled in).
  const OptimizerSpec& spec() const { return spec_; }
  double hyperparameter(std::string_view name) const;

  // One step for `key`: weight -= f(grad, state). grad has weight's shape and
  // dtype, or float32 for a float16/bfloat16 weight. The key's state is made
  // on its first update (zeros; the master copy from the weight). Throws
  // InvalidArgument for other dtypes, shapes, non-CPU arrays, or a state
  // (e.g. loaded from a file) whose size does not fit the weight.
  void update(const Key& key, const ArrayView& weight, const ArrayView& grad);
  // The same step written to `out` instead of `weight` (same shape and
  // dtype; it may be `weight`, or `grad`'s buffer when grad has weight's
  // dtype), leaving `weight` unchanged: a parameter server updates this way
  // when another reader still holds the weight, instead of copying it first.
  // The result is bit for bit the in-place one.
  void update(const Key& key, const ArrayView& weight, const ArrayView& grad, const ArrayView& out);

  // How many updates `key` had (0 if none); Adam's bias correction uses it.
  int64_t update_count(const Key& key) const;
  size_t num_keys() const;
  // Forgets every key's state.
  void clear_states();

  // Serialised states of every key (format: docs/kvstore.md, "Optimizer
  // states"). load_states replaces all states, or throws and changes nothing:
  // IoError for a truncated or corrupt stream (message names `source`),
  // InvalidArgument for states of another optimizer.
  std::string save_states() const;
  void load_states(std::string_view bytes, std::string_view source = "<memory>");
  // One key's states in the same format (no key in it when `key` has none),
  // and the inverse that replaces only the keys present in `bytes` (the
  // parameter servers replicate one key range at a time this way).
  std::string save_key_states(const Key& key) const;
  void merge_states(std::string_view bytes, std::string_view source = "<memory>");
  // To a file (written to PATH.tmp, then renamed) / from a file.
  void save_states_to_file(const std::string& path) const;
  void load_states_from_file(const std::string& path);

  // Per key: update count, then the state arrays (for tests and tools).
  struct KeyState {
    int64_t count = 0;
    std::vector<Array> arrays;   // the rule's state, then the master copy if any
    Array scratch_w, scratch_g;  // float32 work buffers for 16-bit weights
  };

 protected:
  explicit Optimizer(OptimizerSpec full_spec);
  // How many state arrays the rule keeps per weight (momentum, mean, ...).
  virtual int num_rule_states() const = 0;
  // One step over n elements, from weight `w` into `out` (which may be `w`
  // or `g`: read w[i] and g[i] before writing out[i]). `t` is this key's
  // update count, from 1.
  virtual void step(float* out, const float* w, const float* g, float* const* s, size_t n,
                    int64_t t) = 0;
  virtual void step(double* out, const double* w, const double* g, double* const* s, size_t n,
                    int64_t t) = 0;

 private:
  KeyState& state_for(const Key& key);
  std::string save_some(const Key* only) const;
  void load_some(std::string_view bytes, std::string_view source, bool merge);
  OptimizerSpec spec_;
  bool multi_precision_;
  mutable std::mutex mu_;  // guards the map's structure, not the states
  std::map<Key, std::unique_ptr<KeyState>> states_;
};

// Makes the optimizer `spec` names. Unknown name or hyperparameter, or an out
// of range value (e.g. beta1 >= 1) → InvalidArgument listing the valid ones.
std::unique_ptr<Optimizer> create_optimizer(const OptimizerSpec& spec);

}  // namespace pushpull
