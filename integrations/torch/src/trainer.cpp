// SPDX-License-Identifier: Apache-2.0
#include "pushpull/torch/trainer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <string>

#include "pushpull/error.h"
#include "pushpull/log.h"

namespace pushpull::torch {
namespace {

namespace autograd = ::torch::autograd;

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::string s = std::string(c10::toString(t.scalar_type())) + "[";
  for (int64_t i = 0; i < t.dim(); ++i)
    s += (i ? ", " : "") + std::to_string(t.size(i));
  s += "] on " + t.device().str();
  if (!t.is_contiguous()) s += " (not contiguous)";
  return s;
}

// Where a tensor sits, for messages: "parameter 3 (key 3) of replica 1".
std::string where(size_t i, const Key& key, int d) {
  return "parameter " + std::to_string(i) + " (key " + key.to_string() + ") of replica " +
         std::to_string(d);
}

// The layout the store can read through data_ptr, or a message saying why not.
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

}  // namespace

struct Trainer::Impl {
  Impl(std::vector<ParameterList> reps, OptimizerSpec s, KVStore& store, TrainerOptions o);
  ~Impl();

  void check_parameters() const;
  void install_hooks();
  void on_grad_ready(size_t i, int d);
  // The gradients of parameter i on every replica (checked).
  ArrayList gradients(size_t i) const;
  // Pushes parameter i's gradients and pulls its result right behind
  // (pushpull_async): the new value (update_on_kvstore) into every replica,
  // else the summed gradient into summed[i].
  KVHandle exchange(size_t i, const ArrayList& grads);
  ArrayList outputs(size_t i);
  void apply_local_update(size_t i, int64_t global_batch);
  void init();
  void step(int64_t batch_size);

  KVStore& kv;
  OptimizerSpec spec;
  TrainerOptions opt;
  std::vector<ParameterList> replicas;
  size_t n = 0;
  int k = 0;
  std::vector<Key> keys;
  std::unique_ptr<Optimizer> local_optimizer;  // when !update_on_kvstore
  std::vector<at::Tensor> summed;              // pulled gradient sums (local update)
  bool initialised = false;
  int64_t store_global_batch = 0;  // what the store's optimizer was scaled for
  bool warned_batch = false;

  // Round state, shared with the hooks (several backward threads).
  mutable std::mutex mu;
  bool armed = false;             // hooks push (guarded by mu)
  std::vector<int> ready;         // replicas whose gradient of i is in (mu)
  std::vector<uint8_t> pushed;    // (mu)
  std::vector<KVHandle> handles;  // push handles of this round (mu)
  Stats stats;                    // (mu)

  struct Hook {
    std::shared_ptr<autograd::Node> accumulator;  // kept alive so the hook stays
    uintptr_t id = 0;
  };
  std::vector<Hook> hooks;
};

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
  for (size_t i = 0; i < n; ++i)
    keys.emplace_back(opt.key_base + static_cast<int64_t>(i));
  check_parameters();
  if (!opt.update_on_kvstore && kv.type().starts_with("dist_async")) {
    throw InvalidArgument(
        "Trainer: update_on_kvstore = false is not possible with a dist_async store (workers "
        "would apply each other's stale gradients); let the servers run the optimizer");
  }
  if (!(opt.scale > 0)) {
    throw InvalidArgument("Trainer: scale must be > 0, got " + std::to_string(opt.scale));
  }
  // Checks the spec now (InvalidArgument listing the valid names), even when
  // the store will run it.
  auto checked = create_optimizer(spec);
  if (!opt.update_on_kvstore) {
    local_optimizer = std::move(checked);
    for (size_t i = 0; i < n; ++i)
      summed.push_back(at::empty_like(replicas[0][i].detach()));
  }
  ready.assign(n, 0);
  pushed.assign(n, 0);
  handles.resize(n);
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
        throw InvalidArgument("Trainer: " + where(i, keys[i], d) + ", " + describe(t) + ", " + p);
      }
      if (!t.requires_grad() || !t.is_leaf()) {
        throw InvalidArgument("Trainer: " + where(i, keys[i], d) + ", " + describe(t) +
                              ", is not a leaf tensor that requires grad; pass only the "
                              "trainable parameters (module->parameters())");
      }
      if (t.sizes() != replicas[0][i].sizes()) {
        throw InvalidArgument("Trainer: " + where(i, keys[i], d) + " is " + describe(t) +
                              " but on replica 0 it is " + describe(replicas[0][i]) +
                              "; every replica must list the same shapes in the same order");
      }
      if (!seen.insert(t.data_ptr()).second) {
        throw InvalidArgument("Trainer: " + where(i, keys[i], d) +
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

ArrayList Trainer::Impl::gradients(size_t i) const {
  ArrayList list;
  list.reserve(static_cast<size_t>(k));
  for (int d = 0; d < k; ++d) {
    const at::Tensor& p = replicas[static_cast<size_t>(d)][i];
    const at::Tensor& g = p.grad();
    if (!g.defined()) {
      throw InvalidArgument("Trainer::step: " + where(i, keys[i], d) + " (" + describe(p) +
                            ") has no gradient; was it used in the forward pass, and did "
                            "backward() run on every replica before step()?");
    }
    if (auto problem = layout_problem(g); !problem.empty()) {
      throw InvalidArgument("Trainer: the gradient of " + where(i, keys[i], d) + ", " +
                            describe(g) + ", " + problem);
    }
    if (g.sizes() != p.sizes()) {
      throw InvalidArgument("Trainer: the gradient of " + where(i, keys[i], d) + " is " +
                            describe(g) + " but the parameter is " + describe(p));
    }
    list.push_back(view_of(g));
  }
  return list;
}

ArrayList Trainer::Impl::outputs(size_t i) {
  ArrayList outs;
  if (opt.update_on_kvstore) {
    for (int d = 0; d < k; ++d)
      outs.push_back(view_of(replicas[static_cast<size_t>(d)][i]));
  } else {
    outs.push_back(view_of(summed[i]));
  }
  return outs;
}

KVHandle Trainer::Impl::exchange(size_t i, const ArrayList& grads) {
  // One call: the store sends each slice's pull right behind its push, so a
  // server answers it as soon as the round is complete, while backward goes
  // on. Priority -i: the first layers are needed first by the next forward.
  return kv.pushpull_async({keys[i]}, {grads}, {outputs(i)}, -static_cast<int>(i));
}

void Trainer::Impl::on_grad_ready(size_t i, int d) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed) return;
    if (++ready[i] > k) {
      throw InvalidArgument("Trainer: " + where(i, keys[i], d) +
                            " got a second gradient before step(); the Trainer pushes each "
                            "gradient as soon as it is ready, so for gradient accumulation over "
                            "several backward passes set TrainerOptions::push_from_hooks = false");
    }
    if (ready[i] < k) return;
    pushed[i] = 1;
  }
  KVHandle h;
  try {
    h = exchange(i, gradients(i));
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu);
    pushed[i] = 0;  // step() retries and reports the problem
    throw;
  }
  std::lock_guard<std::mutex> lock(mu);
  handles[i] = std::move(h);
  ++stats.hook_pushes;
}

void Trainer::Impl::init() {
  if (initialised) return;
  std::vector<ArrayView> values;
  std::vector<ArrayList> outs(n);
  for (size_t i = 0; i < n; ++i) {
    values.push_back(view_of(replicas[0][i]));
    for (int d = 0; d < k; ++d)
      outs[i].push_back(view_of(replicas[static_cast<size_t>(d)][i]));
  }
  kv.init(keys, values);
  // The store holds rank 0's values: every replica of every worker starts there.
  kv.pull(keys, outs);
  initialised = true;
}

void Trainer::Impl::apply_local_update(size_t i, int64_t global_batch) {
  at::Tensor& g = summed[i];
  // rescale_grad before the optimizer (which applies it first too), so the
  // batch size may change between steps.
  g.mul_(1.0 / static_cast<double>(global_batch));
  const at::Tensor& w0 = replicas[0][i];
  local_optimizer->update(keys[i], view_of(w0), view_of(g));
  for (int d = 1; d < k; ++d) {
    std::memcpy(replicas[static_cast<size_t>(d)][i].data_ptr(), w0.data_ptr(), w0.nbytes());
  }
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
      std::fill(self->ready.begin(), self->ready.end(), 0);
      std::fill(self->pushed.begin(), self->pushed.end(), 0);
      std::fill(self->handles.begin(), self->handles.end(), KVHandle());
      self->armed = self->opt.push_from_hooks;
    }
  } reset{this};

  std::vector<KVHandle> exchanges(n);
  {
    std::lock_guard<std::mutex> lock(mu);
    armed = false;  // no hook may push while step() runs
    // Check every gradient before pushing any, so a bad one changes nothing.
    std::vector<ArrayList> lists(n);
    for (size_t i = 0; i < n; ++i) {
      if (!pushed[i]) lists[i] = gradients(i);
    }
    for (size_t i = 0; i < n; ++i) {
      if (pushed[i]) {
        exchanges[i] = handles[i];
      } else {
        exchanges[i] = exchange(i, lists[i]);
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
  for (size_t i = 0; i < n; ++i) {
    timed_wait(exchanges[i]);
    if (!opt.update_on_kvstore) apply_local_update(i, global_batch);
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
