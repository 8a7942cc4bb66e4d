// SPDX-License-Identifier: Apache-2.0
// pushpull::torch::elastic: Horovod's elastic API for libtorch programs
// (hvd.elastic.run, TorchState; docs/elastic.md), over the state machine of
// include/pushpull/elastic.h and the process-default collective session.
//
//   pushpull::collective::init();
//   torch::optim::SGD sgd(model->parameters(), ...);
//   pushpull::torch::elastic::ElasticDistributedOptimizer opt(sgd,
//   named(model->named_parameters())); pushpull::torch::elastic::TorchState state(*model, sgd);
//   state.add_value("epoch", &epoch);
//   state.track(opt);
//   pushpull::torch::elastic::run(state, [&] {
//     for (; epoch < epochs; ++epoch) { ...; opt.step(); ...; state.commit(); }
//   });
//
// Semantics: as collective::elastic::run (restore on a member's failure,
// re-form with new ranks and size, reset callbacks, sync from rank 0). The
// tracked optimizers are dropped before the old session goes (their
// allreduces belong to it) and rebuilt over the new one after it formed.
//
// Ownership: the model, the optimizer, the tracked optimizers and the
// registered values are the caller's and must outlive the state. Thread
// safety: one training thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pushpull/elastic.h"
#include "pushpull/torch/distributed_optimizer.h"

namespace torch::nn {
class Module;
}

namespace pushpull::torch::elastic {

using collective::elastic::HostsUpdatedInterrupt;

// A DistributedOptimizer over the current default session that follows the
// re-formations (rebuilt by run() after each one).
class ElasticDistributedOptimizer {
 public:
  ElasticDistributedOptimizer(::torch::optim::Optimizer& optimizer, NamedTensors named_parameters,
                              DistributedOptimizerOptions options = {});
  void step() { inner_->step(); }
  void synchronize() { inner_->synchronize(); }
  void zero_grad();
  DistributedOptimizer& inner() { return *inner_; }
  // Drops the optimizer of the old session (before it goes) / builds one
  // over the current default session.
  void detach();
  void attach();

 private:
  ::torch::optim::Optimizer& optimizer_;
  NamedTensors params_;
  DistributedOptimizerOptions options_;
  std::unique_ptr<DistributedOptimizer> inner_;
};

// Horovod's TorchState: the model's parameters and buffers, the optimizer's
// state and hyperparameters, and plain values (epoch, batch, ...).
class TorchState : public collective::elastic::State {
 public:
  TorchState(::torch::nn::Module& model, ::torch::optim::Optimizer& optimizer);
  // A plain value kept in live memory `value` (copied; rank 0's after sync).
  template <typename T>
  void add_value(const std::string& name, T* value) {
    add_bytes(name, value, sizeof(T));
  }
  void add_bytes(const std::string& name, void* data, size_t bytes);
  // Rebuilt over every new session by run().
  void track(ElasticDistributedOptimizer& optimizer) { tracked_.push_back(&optimizer); }
  const std::vector<ElasticDistributedOptimizer*>& tracked() const { return tracked_; }

  void save() override;
  void restore() override;
  void sync() override;

 private:
  ::torch::nn::Module& model_;
  ::torch::optim::Optimizer& optimizer_;
  std::vector<at::Tensor> saved_params_, saved_buffers_;
  std::string saved_optimizer_;
  struct Value {
    void* data;
    std::vector<std::byte> saved;
  };
  std::map<std::string, Value> values_;
  std::vector<ElasticDistributedOptimizer*> tracked_;
};

// hvd.elastic.run for libtorch: collective::elastic::run over the default
// session (re-forming = shutdown() + init()), with the tracked optimizers
// detached before and attached after every re-formation.
void run(TorchState& state, const std::function<void()>& fn);

}  // namespace pushpull::torch::elastic
