// SPDX-License-Identifier: Apache-2.0
#include "pushpull/torch/trainer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
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

// Where a tensor sits, for messages: "parameter 3 (key 3) of replica 1", or
// "parameter 3 (packed in key 2) of replica 1".
std::string where(size_t i, const std::string& key_label, int d) {
  return "parameter " + std::to_string(i) + " (" + key_label + ") of replica " + std::to_string(d);
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

// The parameters of each store key: a parameter of at least `fuse_below`
// bytes alone, smaller ones packed in order into groups of at most
// `bucket_bytes`; ordered by first member (as the Python Trainer packs).
std::vector<std::vector<size_t>> pack_groups(const ParameterList& params, int64_t fuse_below,
                                             int64_t bucket_bytes) {
  std::vector<std::vector<size_t>> groups;
  std::vector<size_t> bucket;
  int64_t size = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t nbytes = params[i].numel() * static_cast<int64_t>(sizeof(float));
    if (nbytes >= fuse_below) {
      groups.push_back({i});
      continue;
    }
    if (!bucket.empty() && size + nbytes > bucket_bytes) {
      groups.push_back(std::move(bucket));
      bucket.clear();
      size = 0;
    }
    bucket.push_back(i);
    size += nbytes;
  }
  if (!bucket.empty()) groups.push_back(std::move(bucket));
  std::sort(groups.begin(), groups.end());
  return groups;
}

}  // namespace

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
  std::vector<std::string> key_labels;         // parameter -> "key 3" / "packed in key 2"
  std::unique_ptr<Optimizer> local_optimizer;  // when !update_on_kvstore
  bool initialised = false;
  int64_t store_global_batch = 0;  // what the store's optimizer was scaled for
  bool warned_batch = false;

  // Round state, shared with the hooks (several backward threads).
  mutable std::mutex mu;
  bool armed = false;             // hooks push (guarded by mu)
  std::vector<int> ready;         // replicas whose gradient of parameter i is in (mu)
  std::vector<size_t> complete;   // parameters of unit u with every gradient in (mu)
  std::vector<uint8_t> pushed;    // per unit (mu)
  std::vector<KVHandle> handles;  // per unit: push handles of this round (mu)
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
    key_labels.push_back("key " + std::to_string(opt.key_base + static_cast<int64_t>(i)));
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
  ready.assign(n, 0);
  complete.assign(units.size(), 0);
  pushed.assign(units.size(), 0);
  handles.resize(units.size());
  install_hooks();
}

void Trainer::Impl::make_units() {
  unit_of.assign(n, 0);
  for (auto& members : pack_groups(replicas[0], opt.fuse_below, opt.bucket_bytes)) {
    Unit u;
    u.key = Key(opt.key_base + static_cast<int64_t>(members[0]));
    u.members = std::move(members);
    const auto cpu_float = at::TensorOptions().dtype(at::kFloat);
    if (u.packed()) {
      int64_t numel = 0;
      for (size_t i : u.members) {
        u.offsets.push_back(numel);
        numel += replicas[0][i].numel();
        key_labels[i] = "packed in key " + u.key.to_string();
      }
      for (int d = 0; d < k; ++d)
        u.grads.push_back(at::empty({numel}, cpu_float));
      u.value = at::empty({numel}, cpu_float);
      if (!opt.update_on_kvstore) u.weight = at::empty({numel}, cpu_float);
    } else if (!opt.update_on_kvstore) {
      u.value = at::empty_like(replicas[0][u.members[0]].detach());
    }
    for (size_t i : u.members)
      unit_of[i] = units.size();
    units.push_back(std::move(u));
  }
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
        throw InvalidArgument("Trainer: " + where(i, key_labels[i], d) + ", " + describe(t) + ", " +
                              p);
      }
      if (!t.requires_grad() || !t.is_leaf()) {
        throw InvalidArgument("Trainer: " + where(i, key_labels[i], d) + ", " + describe(t) +
                              ", is not a leaf tensor that requires grad; pass only the "
                              "trainable parameters (module->parameters())");
      }
      if (t.sizes() != replicas[0][i].sizes()) {
        throw InvalidArgument("Trainer: " + where(i, key_labels[i], d) + " is " + describe(t) +
                              " but on replica 0 it is " + describe(replicas[0][i]) +
                              "; every replica must list the same shapes in the same order");
      }
      if (!seen.insert(t.data_ptr()).second) {
        throw InvalidArgument("Trainer: " + where(i, key_labels[i], d) +
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

const at::Tensor& Trainer::Impl::checked_gradient(size_t i, int d) const {
  const at::Tensor& p = replicas[static_cast<size_t>(d)][i];
  const at::Tensor& g = p.grad();
  if (!g.defined()) {
    throw InvalidArgument("Trainer::step: " + where(i, key_labels[i], d) + " (" + describe(p) +
                          ") has no gradient; was it used in the forward pass, and did "
                          "backward() run on every replica before step()?");
  }
  if (auto problem = layout_problem(g); !problem.empty()) {
    throw InvalidArgument("Trainer: the gradient of " + where(i, key_labels[i], d) + ", " +
                          describe(g) + ", " + problem);
  }
  if (g.sizes() != p.sizes()) {
    throw InvalidArgument("Trainer: the gradient of " + where(i, key_labels[i], d) + " is " +
                          describe(g) + " but the parameter is " + describe(p));
  }
  return g;
}

ArrayList Trainer::Impl::gradients(size_t u) {
  Unit& unit = units[u];
  ArrayList list;
  list.reserve(static_cast<size_t>(k));
  if (!unit.packed()) {
    for (int d = 0; d < k; ++d)
      list.push_back(view_of(checked_gradient(unit.members[0], d)));
    return list;
  }
  for (int d = 0; d < k; ++d) {  // every one checked before any is copied
    for (size_t i : unit.members)
      checked_gradient(i, d);
  }
  for (int d = 0; d < k; ++d) {
    auto* flat = static_cast<char*>(unit.grads[static_cast<size_t>(d)].data_ptr());
    for (size_t j = 0; j < unit.members.size(); ++j) {
      const at::Tensor& g = replicas[static_cast<size_t>(d)][unit.members[j]].grad();
      std::memcpy(flat + unit.offsets[j] * sizeof(float), g.data_ptr(), g.nbytes());
    }
    list.push_back(view_of(unit.grads[static_cast<size_t>(d)]));
  }
  return list;
}

void Trainer::Impl::gather(const Unit& u, int d, const at::Tensor& flat) const {
  auto* dst = static_cast<char*>(flat.data_ptr());
  for (size_t j = 0; j < u.members.size(); ++j) {
    const at::Tensor& p = replicas[static_cast<size_t>(d)][u.members[j]];
    std::memcpy(dst + u.offsets[j] * sizeof(float), p.data_ptr(), p.nbytes());
  }
}

void Trainer::Impl::scatter(const Unit& u, const at::Tensor& flat, int d) {
  const auto* src = static_cast<const char*>(flat.data_ptr());
  for (size_t j = 0; j < u.members.size(); ++j) {
    at::Tensor& p = replicas[static_cast<size_t>(d)][u.members[j]];
    std::memcpy(p.data_ptr(), src + u.offsets[j] * sizeof(float), p.nbytes());
  }
}

ArrayList Trainer::Impl::outputs(size_t u) {
  const Unit& unit = units[u];
  if (unit.value.defined()) return {view_of(unit.value)};
  ArrayList outs;
  for (int d = 0; d < k; ++d)
    outs.push_back(view_of(replicas[static_cast<size_t>(d)][unit.members[0]]));
  return outs;
}

KVHandle Trainer::Impl::exchange(size_t u, const ArrayList& grads) {
  // One call: the store sends each slice's pull right behind its push, so a
  // server answers it as soon as the round is complete, while backward goes
  // on. Priority -i: the first layers are needed first by the next forward.
  return kv.pushpull_async({units[u].key}, {grads}, {outputs(u)},
                           -static_cast<int>(units[u].members[0]));
}

void Trainer::Impl::on_grad_ready(size_t i, int d) {
  const size_t u = unit_of[i];
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed) return;
    if (++ready[i] > k) {
      throw InvalidArgument("Trainer: " + where(i, key_labels[i], d) +
                            " got a second gradient before step(); the Trainer pushes each "
                            "gradient as soon as it is ready, so for gradient accumulation over "
                            "several backward passes set TrainerOptions::push_from_hooks = false");
    }
    if (ready[i] < k) return;
    if (++complete[u] < units[u].members.size()) return;
    pushed[u] = 1;
  }
  KVHandle h;
  try {
    h = exchange(u, gradients(u));
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu);
    pushed[u] = 0;  // step() retries and reports the problem
    throw;
  }
  std::lock_guard<std::mutex> lock(mu);
  handles[u] = std::move(h);
  ++stats.hook_pushes;
}

void Trainer::Impl::init() {
  if (initialised) return;
  std::vector<Key> keys;
  std::vector<ArrayView> values;
  std::vector<ArrayList> outs;
  for (size_t u = 0; u < units.size(); ++u) {
    const Unit& unit = units[u];
    keys.push_back(unit.key);
    if (unit.packed()) {
      gather(unit, 0, unit.value);
      values.push_back(view_of(unit.value));
      outs.push_back({view_of(unit.value)});
    } else {
      values.push_back(view_of(replicas[0][unit.members[0]]));
      ArrayList all;
      for (int d = 0; d < k; ++d)
        all.push_back(view_of(replicas[static_cast<size_t>(d)][unit.members[0]]));
      outs.push_back(std::move(all));
    }
  }
  kv.init(keys, values);
  // The store holds rank 0's values: every replica of every worker starts there.
  kv.pull(keys, outs);
  for (const Unit& unit : units) {
    if (!unit.packed()) continue;
    for (int d = 0; d < k; ++d)
      scatter(unit, unit.value, d);
  }
  initialised = true;
}

void Trainer::Impl::finish(size_t u, int64_t global_batch) {
  const Unit& unit = units[u];
  if (!opt.update_on_kvstore) {
    apply_local_update(u, global_batch);
  } else if (unit.packed()) {
    for (int d = 0; d < k; ++d)
      scatter(unit, unit.value, d);
  }
}

void Trainer::Impl::apply_local_update(size_t u, int64_t global_batch) {
  Unit& unit = units[u];
  at::Tensor& g = unit.value;
  // rescale_grad before the optimizer (which applies it first too), so the
  // batch size may change between steps.
  g.mul_(1.0 / static_cast<double>(global_batch));
  if (unit.packed()) {
    gather(unit, 0, unit.weight);
    local_optimizer->update(unit.key, view_of(unit.weight), view_of(g));
    for (int d = 0; d < k; ++d)
      scatter(unit, unit.weight, d);
    return;
  }
  const at::Tensor& w0 = replicas[0][unit.members[0]];
  local_optimizer->update(unit.key, view_of(w0), view_of(g));
  for (int d = 1; d < k; ++d) {
    std::memcpy(replicas[static_cast<size_t>(d)][unit.members[0]].data_ptr(), w0.data_ptr(),
                w0.nbytes());
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
      std::fill(self->complete.begin(), self->complete.end(), 0);
      std::fill(self->pushed.begin(), self->pushed.end(), 0);
      std::fill(self->handles.begin(), self->handles.end(), KVHandle());
      self->armed = self->opt.push_from_hooks;
    }
  } reset{this};

  const size_t m = units.size();
  std::vector<KVHandle> exchanges(m);
  {
    std::lock_guard<std::mutex> lock(mu);
    armed = false;  // no hook may push while step() runs
    // Check every gradient before pushing any, so a bad one changes nothing.
    std::vector<ArrayList> lists(m);
    for (size_t u = 0; u < m; ++u) {
      if (!pushed[u]) lists[u] = gradients(u);
    }
    for (size_t u = 0; u < m; ++u) {
      if (pushed[u]) {
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
