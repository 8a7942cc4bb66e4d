// SPDX-License-Identifier: Apache-2.0
// Trainer: construction and checks, the autograd hooks, step(). The store
// keys (packing, gradients in, results out) are in trainer_keys.cpp.
#include "pushpull/torch/trainer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <string>

#include "pushpull/error.h"
#include "pushpull/log.h"
#include "trainer_impl.h"

namespace pushpull::torch {

namespace trainer_detail {

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::string s = std::string(c10::toString(t.scalar_type())) + "[";
  for (int64_t i = 0; i < t.dim(); ++i)
    s += (i ? ", " : "") + std::to_string(t.size(i));
  s += "] on " + t.device().str();
  if (!t.is_contiguous()) s += " (not contiguous)";
  return s;
}

std::string where(size_t i, const std::string& key_label, int d) {
  return "parameter " + std::to_string(i) + " (" + key_label + ") of replica " + std::to_string(d);
}

std::string layout_problem(const at::Tensor& t) {
  if (!t.defined()) return "is undefined";
  if (!t.device().is_cpu()) return "is not on the CPU (move the model with ->to(torch::kCPU))";
  if (t.scalar_type() != at::kFloat) {
    return "is not float32 (convert the model with ->to(torch::kFloat32))";
  }
  if (t.layout() != at::kStrided) return "is not a dense (strided) tensor";
  if (!t.is_contiguous()) return "is not contiguous (make it contiguous before training)";
  if (t.dim() > Shape::kMaxDims) {
    return "has more than " + std::to_string(Shape::kMaxDims) + " dimensions";
  }
  return {};
}

ArrayView view_of(const at::Tensor& t) {
  return ArrayView(t.data_ptr(), DType::kFloat32,
                   Shape(std::span<const int64_t>(t.sizes().data(), t.sizes().size())),
                   Device::cpu());
}

}  // namespace trainer_detail

using namespace trainer_detail;

namespace autograd = ::torch::autograd;

namespace {

// Runs after AccumulateGrad wrote the parameter's .grad (a post hook, which
// libtorch 1.13 has no tensor-level API for).
class GradReadyHook final : public autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  autograd::variable_list operator()(const autograd::variable_list& outputs,
                                     const autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

Trainer::Impl::Impl(std::vector<ParameterList> reps, OptimizerSpec s, KVStore& store,
                    TrainerOptions o)
    : kv(store), spec(std::move(s)), opt(o), replicas(std::move(reps)) {
  if (replicas.empty()) {
    throw InvalidArgument("Trainer: no replicas given; pass the parameters of at least one model");
  }
  k = static_cast<int>(replicas.size());
  n = replicas[0].size();
  if (n == 0) throw InvalidArgument("Trainer: the model has no parameters to train");
  check_parameters();
  if (!opt.update_on_kvstore && kv.type().starts_with("dist_async")) {
    throw InvalidArgument(
        "Trainer: update_on_kvstore = false is not possible with a dist_async store (workers "
        "would apply each other's stale gradients); let the servers run the optimizer");
  }
  if (!(opt.scale > 0)) {
    throw InvalidArgument("Trainer: scale must be > 0, got " + std::to_string(opt.scale));
  }
  if (opt.fuse_below < 0 || opt.bucket_bytes <= 0) {
    throw InvalidArgument("Trainer: fuse_below must be >= 0 and bucket_bytes > 0, got " +
                          std::to_string(opt.fuse_below) + " and " +
                          std::to_string(opt.bucket_bytes));
  }
  // Checks the spec now (InvalidArgument listing the valid names), even when
  // the store will run it.
  auto checked = create_optimizer(spec);
  if (!opt.update_on_kvstore) local_optimizer = std::move(checked);
  make_units();
  std::vector<std::vector<size_t>> members;
  for (const auto& u : units)
    members.push_back(u.members);
  schedule = std::make_unique<frontend::PushSchedule>(members, n, k, opt.push_from_hooks);
  handles.resize(units.size());
  install_hooks();
}

Trainer::Impl::~Impl() {
  for (auto& h : hooks) {
    if (h.accumulator) h.accumulator->del_post_hook(h.id);
  }
  // Exchanges started by hooks and never collected by a step() (an error, or
  // a Trainer destroyed mid-round) still read gradients and write parameters:
  // they must end before those tensors may go. Their errors were the
  // round's, which nobody waits for any more.
  std::vector<KVHandle> pending;
  {
    std::lock_guard<std::mutex> lock(mu);
    pending = handles;
  }
  for (const auto& h : pending) {
    try {
      kv.wait(h);
    } catch (const std::exception& e) {
      PP_DEBUG("Trainer: an exchange left at destruction failed: {}", e.what());
    }
  }
}

void Trainer::Impl::check_parameters() const {
  std::set<const void*> seen;
  for (int d = 0; d < k; ++d) {
    const auto& rep = replicas[static_cast<size_t>(d)];
    if (rep.size() != n) {
      throw InvalidArgument("Trainer: replica " + std::to_string(d) + " has " +
                            std::to_string(rep.size()) + " parameters but replica 0 has " +
                            std::to_string(n) + "; every replica must be the same model");
    }
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& t = rep[i];
      if (auto p = layout_problem(t); !p.empty()) {
        throw InvalidArgument("Trainer: " + where(i, key_label(i), d) + ", " + describe(t) + ", " +
                              p);
      }
      if (!t.requires_grad() || !t.is_leaf()) {
        throw InvalidArgument("Trainer: " + where(i, key_label(i), d) + ", " + describe(t) +
                              ", is not a leaf tensor that requires grad; pass only the "
                              "trainable parameters (module->parameters())");
      }
      if (t.sizes() != replicas[0][i].sizes()) {
        throw InvalidArgument("Trainer: " + where(i, key_label(i), d) + " is " + describe(t) +
                              " but on replica 0 it is " + describe(replicas[0][i]) +
                              "; every replica must list the same shapes in the same order");
      }
      if (!seen.insert(t.data_ptr()).second) {
        throw InvalidArgument("Trainer: " + where(i, key_label(i), d) +
                              " shares its memory with another parameter; each replica needs "
                              "its own copy of the model (clone the module per device)");
      }
    }
  }
}

void Trainer::Impl::install_hooks() {
  if (!opt.push_from_hooks) return;
  for (int d = 0; d < k; ++d) {
    for (size_t i = 0; i < n; ++i) {
      auto acc = autograd::impl::grad_accumulator(replicas[static_cast<size_t>(d)][i]);
      if (!acc) continue;  // cannot happen for leaves requiring grad; step() pushes then
      const uintptr_t id = acc->add_post_hook(
          std::make_unique<GradReadyHook>([this, i, d] { on_grad_ready(i, d); }));
      hooks.push_back({std::move(acc), id});
    }
  }
}

void Trainer::Impl::on_grad_ready(size_t i, int d) {
  // When to push: frontend/push_schedule.h (the Python Trainer's too).
  const auto ready = schedule->grad_ready(i);
  if (ready.what == frontend::PushSchedule::Ready::kSecond) {
    throw InvalidArgument("Trainer: " + where(i, key_label(i), d) +
                          " got a second gradient before step(); the Trainer pushes each "
                          "gradient as soon as it is ready, so for gradient accumulation over "
                          "several backward passes set TrainerOptions::push_from_hooks = false");
  }
  if (ready.what != frontend::PushSchedule::Ready::kPush) return;
  const size_t u = ready.unit;
  KVHandle h;
  try {
    h = exchange(u, gradients(u));
  } catch (...) {
    schedule->push_failed(u);  // step() retries and reports the problem
    throw;
  }
  std::lock_guard<std::mutex> lock(mu);
  handles[u] = std::move(h);
  ++stats.hook_pushes;
}

void Trainer::Impl::step(int64_t batch_size) {
  if (batch_size <= 0) {
    throw InvalidArgument("Trainer::step: batch_size must be > 0, got " +
                          std::to_string(batch_size));
  }
  init();
  const int64_t global_batch = batch_size * kv.num_workers();
  if (opt.update_on_kvstore) {
    if (store_global_batch == 0) {
      OptimizerSpec scaled = spec;
      auto it = scaled.hyperparameters.find("rescale_grad");
      const double user_scale = it == scaled.hyperparameters.end() ? 1.0 : it->second;
      scaled.hyperparameters["rescale_grad"] =
          user_scale * opt.scale / static_cast<double>(global_batch);
      kv.set_optimizer(scaled);
      store_global_batch = global_batch;
    } else if (global_batch != store_global_batch && !warned_batch) {
      warned_batch = true;
      PP_WARN(
          "Trainer::step: global batch {} differs from the first step's {}; with "
          "update_on_kvstore the store's rescale_grad stays 1/{} (as in Gluon). Keep batches "
          "equal (drop the last partial batch) or set update_on_kvstore = false",
          global_batch, store_global_batch, store_global_batch);
    }
  }

  // Whatever happens below, the next round starts clean.
  struct RoundReset {
    Impl* self;
    ~RoundReset() {
      std::lock_guard<std::mutex> lock(self->mu);
      std::fill(self->handles.begin(), self->handles.end(), KVHandle());
      self->schedule->end_round();
    }
  } reset{this};

  const size_t m = units.size();
  std::vector<KVHandle> exchanges(m);
  {
    std::lock_guard<std::mutex> lock(mu);
    schedule->disarm();  // no hook may push while step() runs
    // Check every gradient before pushing any, so a bad one changes nothing.
    std::vector<ArrayList> lists(m);
    for (size_t u = 0; u < m; ++u) {
      if (!schedule->pushed(u)) lists[u] = gradients(u);
    }
    for (size_t u = 0; u < m; ++u) {
      if (schedule->pushed(u)) {
        exchanges[u] = handles[u];
      } else {
        exchanges[u] = exchange(u, lists[u]);
        ++stats.step_pushes;
      }
    }
  }
  double waited = 0;
  auto timed_wait = [&](const KVHandle& h) {
    const auto t0 = std::chrono::steady_clock::now();
    kv.wait(h);
    waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (size_t u = 0; u < m; ++u) {
    timed_wait(exchanges[u]);
    finish(u, global_batch);
  }
  std::lock_guard<std::mutex> lock(mu);
  stats.wait_seconds += waited;
  ++stats.steps;
}

// ---- Trainer ----

Trainer::Trainer(std::vector<ParameterList> replicas, OptimizerSpec optimizer, KVStore& kvstore,
                 TrainerOptions options)
    : impl_(std::make_unique<Impl>(std::move(replicas), std::move(optimizer), kvstore, options)) {}

Trainer::Trainer(std::vector<ParameterList> replicas, OptimizerSpec optimizer, KVStore& kvstore,
                 bool update_on_kvstore)
    : Trainer(std::move(replicas), std::move(optimizer), kvstore,
              TrainerOptions{.update_on_kvstore = update_on_kvstore}) {}

Trainer::Trainer(ParameterList parameters, OptimizerSpec optimizer, KVStore& kvstore,
                 bool update_on_kvstore)
    : Trainer(std::vector<ParameterList>{std::move(parameters)}, std::move(optimizer), kvstore,
              update_on_kvstore) {}

Trainer::~Trainer() = default;

void Trainer::init() {
  impl_->init();
}
void Trainer::step(int64_t batch_size) {
  impl_->step(batch_size);
}
size_t Trainer::num_parameters() const {
  return impl_->n;
}
std::vector<Key> Trainer::keys() const {
  std::vector<Key> keys;
  for (const auto& u : impl_->units)
    keys.push_back(u.key);
  return keys;
}
int Trainer::num_devices() const {
  return impl_->k;
}
bool Trainer::update_on_kvstore() const {
  return impl_->opt.update_on_kvstore;
}
KVStore& Trainer::kvstore() const {
  return impl_->kv;
}
Trainer::Stats Trainer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace pushpull::torch
