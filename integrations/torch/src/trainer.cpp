// SPDX-License-Identifier: Apache-2.0
// Trainer: libtorch's glue around frontend::TrainerCore (trainer_impl.h):
// the checks of tensors and their messages, the autograd hooks, the views
// the core asks for.
#include "pushpull/torch/trainer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>

#include "pushpull/error.h"
#include "pushpull/log.h"
#include "trainer_impl.h"

namespace pushpull::torch {

namespace {

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

namespace autograd = ::torch::autograd;

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
    : kv(store), opt(o), replicas(std::move(reps)) {
  if (replicas.empty()) {
    throw InvalidArgument("Trainer: no replicas given; pass the parameters of at least one model");
  }
  k = static_cast<int>(replicas.size());
  n = replicas[0].size();
  if (n == 0) throw InvalidArgument("Trainer: the model has no parameters to train");
  check_parameters();
  std::vector<Shape> shapes;
  for (const auto& p : replicas[0])
    shapes.push_back(view_of(p).shape);
  tensors.self = this;
  // The step itself (keys, init, pushes, rescale, local update):
  // frontend/trainer_core.h, as the Python Trainer's.
  core = std::make_unique<frontend::TrainerCore>(
      [&store]() -> KVStore& { return store; }, std::move(s), std::move(shapes), k,
      frontend::TrainerCoreOptions{.update_on_kvstore = opt.update_on_kvstore,
                                   .push_from_hooks = opt.push_from_hooks,
                                   .key_base = opt.key_base,
                                   .scale = opt.scale,
                                   .fuse_below = opt.fuse_below,
                                   .bucket_bytes = opt.bucket_bytes},
      tensors);
  install_hooks();
}

Trainer::Impl::~Impl() {
  for (auto& h : hooks) {
    if (h.accumulator) h.accumulator->del_post_hook(h.id);
  }
  // Then the core waits for exchanges that hooks started and no step()
  // collected: they still read gradients and write parameters.
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
  // When to push, and the push itself: the core (the Python Trainer's too).
  if (core->grad_ready(i) == frontend::PushSchedule::Ready::kSecond) {
    throw InvalidArgument("Trainer: " + where(i, key_label(i), d) +
                          " got a second gradient before step(); the Trainer pushes each "
                          "gradient as soon as it is ready, so for gradient accumulation over "
                          "several backward passes set TrainerOptions::push_from_hooks = false");
  }
}

std::string Trainer::Impl::key_label(size_t i) const {
  if (!core)  // before the core: parameter i's own key
    return "key " + std::to_string(opt.key_base + static_cast<int64_t>(i));
  return core->key_label(i);
}

const at::Tensor& Trainer::Impl::checked_gradient(size_t i, int d) const {
  const at::Tensor& p = replicas[static_cast<size_t>(d)][i];
  const at::Tensor& g = p.grad();
  if (!g.defined()) {
    throw InvalidArgument("Trainer::step: " + where(i, key_label(i), d) + " (" + describe(p) +
                          ") has no gradient; was it used in the forward pass, and did "
                          "backward() run on every replica before step()?");
  }
  if (auto problem = layout_problem(g); !problem.empty()) {
    throw InvalidArgument("Trainer: the gradient of " + where(i, key_label(i), d) + ", " +
                          describe(g) + ", " + problem);
  }
  if (g.sizes() != p.sizes()) {
    throw InvalidArgument("Trainer: the gradient of " + where(i, key_label(i), d) + " is " +
                          describe(g) + " but the parameter is " + describe(p));
  }
  return g;
}

ArrayView Trainer::Impl::Tensors::weight(size_t i, int d) {
  return view_of(self->replicas[static_cast<size_t>(d)][i]);
}

ArrayView Trainer::Impl::Tensors::gradient(size_t i, int d) {
  return view_of(self->checked_gradient(i, d));
}

void Trainer::Impl::Tensors::batch_changed(int64_t batch, int64_t first_batch, int workers) {
  if (self->warned_batch) return;
  self->warned_batch = true;
  PP_WARN(
      "Trainer::step: global batch {} differs from the first step's {}; with "
      "update_on_kvstore the store's rescale_grad stays 1/{} (as in Gluon). Keep batches "
      "equal (drop the last partial batch) or set update_on_kvstore = false",
      batch * workers, first_batch * workers, first_batch * workers);
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
  impl_->core->init();
}
void Trainer::step(int64_t batch_size) {
  impl_->core->step(batch_size);
}
size_t Trainer::num_parameters() const {
  return impl_->n;
}
std::vector<Key> Trainer::keys() const {
  std::vector<Key> keys;
  for (const auto& u : impl_->core->units())
    keys.push_back(Key(u.key));
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
  const auto s = impl_->core->stats();
  return {s.steps, s.hook_pushes, s.step_pushes, s.wait_seconds};
}

}  // namespace pushpull::torch
