// SPDX-License-Identifier: Apache-2.0
#include "pushpull/torch/distributed_optimizer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <unordered_map>

#include "compressed_grads.h"
#include "pushpull/error.h"
#include "pushpull/log.h"
#include "tensor_collectives.h"

namespace pushpull::torch {
namespace {

namespace autograd = ::torch::autograd;
using collective::Communicator;
using collective::Handle;
using detail::describe;
using detail::layout_problem;
using detail::view_of;
using detail::wait_all;

// Runs after AccumulateGrad wrote the parameter's .grad (libtorch 1.13 has no
// tensor-level post-accumulate hook; the Trainer uses the same trick).
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

struct DistributedOptimizer::Impl {
  struct Param {
    std::string name;  // the parameter's name (messages)
    std::string op_name;
    at::Tensor tensor;
    // Round state (guarded by mu).
    int passes = 0;
    bool submitted = false;
    Handle handle;
    at::Tensor reduced;  // what the allreduce writes: .grad, or a contiguous copy of it
                         // (2bit/1bit: this rank's codes, allgathered)
    // Hooks.
    std::shared_ptr<autograd::Node> accumulator;
    uintptr_t post_id = 0;
    unsigned pre_id = 0;
    bool has_pre = false;
  };

  Impl(::torch::optim::Optimizer& o, const NamedTensors& named, Communicator& c,
       DistributedOptimizerOptions opts);
  ~Impl();
  void install_hooks();
  void before_accumulate(size_t i);
  void on_grad_ready(size_t i);
  void submit(size_t i);  // mu held
  void synchronize(bool submit_missing);

  ::torch::optim::Optimizer& opt;
  Communicator& comm;
  DistributedOptimizerOptions o;
  // This rank reduces (it is in the process set, or there is none).
  bool member = true;
  std::vector<Param> params;
  mutable std::mutex mu;
  bool synced = false;  // synchronize() ran since the last step() (mu)
  // 2bit/1bit: the codec and every parameter's residual (used under mu).
  std::unique_ptr<detail::CompressedGrads> codes;
  int members = 0;  // ranks that reduce
  Stats stats;      // (mu)
};

DistributedOptimizer::Impl::Impl(::torch::optim::Optimizer& optimizer, const NamedTensors& named,
                                 Communicator& c, DistributedOptimizerOptions opts)
    : opt(optimizer), comm(c), o(std::move(opts)) {
  if (o.backward_passes_per_step < 1) {
    throw InvalidArgument("DistributedOptimizer: backward_passes_per_step must be >= 1, got " +
                          std::to_string(o.backward_passes_per_step));
  }
  if (o.op != collective::Reduction::kAverage && o.op != collective::Reduction::kSum) {
    throw InvalidArgument("DistributedOptimizer: op must be average or sum, got " +
                          std::string(collective::reduction_name(o.op)));
  }
  if (!(o.gradient_predivide_factor > 0) ||
      (o.gradient_predivide_factor != 1.0 && o.op != collective::Reduction::kAverage)) {
    throw InvalidArgument(
        "DistributedOptimizer: gradient_predivide_factor must be > 0, and other than 1 only "
        "with op average (it divides before the sum and multiplies the average back), got " +
        std::to_string(o.gradient_predivide_factor));
  }
  std::set<int> members;
  for (int r : o.process_set)
    if (r < 0 || r >= comm.size() || !members.insert(r).second)
      throw InvalidArgument("DistributedOptimizer: process_set names rank " + std::to_string(r) +
                            (r < 0 || r >= comm.size()
                                 ? " outside 0.." + std::to_string(comm.size() - 1)
                                 : " twice"));
  // A set of every rank is the global set: no member list to negotiate.
  if (static_cast<int>(members.size()) == comm.size()) o.process_set.clear();
  std::sort(o.process_set.begin(), o.process_set.end());
  member = o.process_set.empty() || members.count(comm.rank()) > 0;
  this->members = o.process_set.empty() ? comm.size() : static_cast<int>(o.process_set.size());
  if (o.compression == Compression::kTwoBit || o.compression == Compression::kOneBit)
    codes = std::make_unique<detail::CompressedGrads>(
        o.compression == Compression::kTwoBit ? "2bit" : "1bit", o.compression_threshold);
  std::unordered_map<const void*, std::string> name_of;
  std::set<std::string> names;
  for (const auto& [name, t] : named) {
    if (!names.insert(name).second) {
      throw InvalidArgument("DistributedOptimizer: the name '" + name +
                            "' appears twice in named_parameters; names must be unique (they "
                            "name the allreduces on every rank)");
    }
    if (t.defined()) name_of.emplace(t.unsafeGetTensorImpl(), name);
  }
  std::set<const void*> seen;
  const auto& groups = opt.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& ps = groups[g].params();
    for (size_t j = 0; j < ps.size(); ++j) {
      const at::Tensor& p = ps[j];
      const std::string where =
          "parameter " + std::to_string(j) + " of parameter group " + std::to_string(g);
      if (!p.defined()) {
        throw InvalidArgument("DistributedOptimizer: " + where + " of the optimizer is undefined");
      }
      if (!seen.insert(p.unsafeGetTensorImpl()).second || !p.requires_grad()) continue;
      auto it = name_of.find(p.unsafeGetTensorImpl());
      if (it == name_of.end()) {
        throw InvalidArgument("DistributedOptimizer: " + where + " (" + describe(p) +
                              ") of the optimizer is not in named_parameters; pass "
                              "named(module->named_parameters()) of the model it trains");
      }
      if (auto problem = layout_problem(p, false); !problem.empty()) {
        throw InvalidArgument("DistributedOptimizer: parameter '" + it->second + "', " +
                              describe(p) + ", " + problem);
      }
      if (!p.is_leaf()) {
        throw InvalidArgument("DistributedOptimizer: parameter '" + it->second +
                              "' is not a leaf tensor; optimizers train leaves");
      }
      Param param;
      param.name = it->second;
      param.op_name = o.name_prefix + it->second;
      param.tensor = p;
      params.push_back(std::move(param));
    }
  }
  install_hooks();
}

DistributedOptimizer::Impl::~Impl() {
  for (auto& p : params) {
    if (p.accumulator) p.accumulator->del_post_hook(p.post_id);
    if (p.has_pre) p.tensor.remove_hook(p.pre_id);
  }
  // No reduction may write into a gradient after we are gone.
  std::vector<Handle> pending;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& p : params)
      if (p.submitted) pending.push_back(p.handle);
  }
  try {
    wait_all(comm, pending);
  } catch (const std::exception& e) {
    PP_WARN("DistributedOptimizer: an allreduce in flight at destruction failed: {}", e.what());
  }
}

void DistributedOptimizer::Impl::install_hooks() {
  for (size_t i = 0; i < params.size(); ++i) {
    Param& p = params[i];
    // Before accumulation: a pass too many is refused before it touches a
    // gradient that is being reduced.
    p.pre_id = p.tensor.register_hook([this, i](const at::Tensor&) { before_accumulate(i); });
    p.has_pre = true;
    p.accumulator = autograd::impl::grad_accumulator(p.tensor);
    if (p.accumulator) {
      p.post_id = p.accumulator->add_post_hook(
          std::make_unique<GradReadyHook>([this, i] { on_grad_ready(i); }));
    }
  }
}

void DistributedOptimizer::Impl::before_accumulate(size_t i) {
  std::lock_guard<std::mutex> lock(mu);
  if (params[i].submitted) {
    throw InvalidArgument(
        "DistributedOptimizer: parameter '" + params[i].name + "' got a gradient from more than " +
        std::to_string(o.backward_passes_per_step) +
        " backward pass(es) before step(); its allreduce is already running. Call step() (or "
        "synchronize()) after every backward_passes_per_step backward passes, or raise "
        "DistributedOptimizerOptions::backward_passes_per_step to accumulate more locally");
  }
}

void DistributedOptimizer::Impl::on_grad_ready(size_t i) {
  std::lock_guard<std::mutex> lock(mu);
  Param& p = params[i];
  if (!member || p.submitted || ++p.passes < o.backward_passes_per_step) return;
  submit(i);
  ++stats.hook_allreduces;
}

void DistributedOptimizer::Impl::submit(size_t i) {
  Param& p = params[i];
  at::Tensor g = p.tensor.grad();
  if (!g.defined()) {
    // Unused on this rank (maybe used on another): contribute zeros, so every
    // rank submits every name and nobody stalls (Horovod does the same).
    p.tensor.mutable_grad() = at::zeros_like(p.tensor);
    g = p.tensor.grad();
  }
  if (auto problem = layout_problem(g, false); !problem.empty()) {
    throw InvalidArgument("DistributedOptimizer: the gradient of '" + p.name + "', " + describe(g) +
                          ", " + problem);
  }
  if (g.sizes() != p.tensor.sizes() || g.scalar_type() != p.tensor.scalar_type()) {
    throw InvalidArgument("DistributedOptimizer: the gradient of '" + p.name + "' is " +
                          describe(g) + " but the parameter is " + describe(p.tensor));
  }
  at::NoGradGuard no_grad;
  double scale = 1.0 / o.gradient_predivide_factor;
  if (o.average_aggregated_gradients && o.backward_passes_per_step > 1)
    scale /= o.backward_passes_per_step;
  if (codes) {  // 2bit/1bit: codes cannot be summed on the way; every rank sums them all
    p.reduced = codes->encode(i, g, scale);
    p.handle = comm.allgather_async(p.op_name, view_of(p.reduced), o.process_set);
    p.submitted = true;
    return;
  }
  const bool fp16 = o.compression == Compression::kFp16 &&
                    (g.scalar_type() == at::kFloat || g.scalar_type() == at::kDouble);
  // fp16: a half-size copy travels (synchronize() casts the result back).
  p.reduced = fp16 ? g.to(at::kHalf).contiguous() : (g.is_contiguous() ? g : g.contiguous());
  if (scale != 1.0) p.reduced.mul_(scale);
  p.handle = comm.allreduce_async(p.op_name, view_of(p.reduced), view_of(p.reduced), o.op,
                                  o.process_set, o.gradient_predivide_factor);
  p.submitted = true;
}

void DistributedOptimizer::Impl::synchronize(bool submit_missing) {
  std::vector<Handle> handles;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (submit_missing && !member) {
      // Outside the process set: the optimizer is local; only the passes
      // of accumulated gradients are averaged, as a member's would be.
      if (o.average_aggregated_gradients && o.backward_passes_per_step > 1) {
        at::NoGradGuard no_grad;
        for (auto& p : params)
          if (p.tensor.grad().defined())
            p.tensor.mutable_grad().mul_(1.0 / o.backward_passes_per_step);
      }
      for (auto& p : params)
        p.passes = 0;
      synced = true;
      return;
    }
    if (submit_missing) {
      // Check every gradient before submitting any, so a bad one starts nothing.
      for (auto& p : params) {
        if (p.submitted || !p.tensor.grad().defined()) continue;
        const at::Tensor& g = p.tensor.grad();
        if (auto problem = layout_problem(g, false); !problem.empty()) {
          throw InvalidArgument("DistributedOptimizer: the gradient of '" + p.name + "', " +
                                describe(g) + ", " + problem);
        }
      }
      for (size_t i = 0; i < params.size(); ++i) {
        if (params[i].submitted) continue;
        submit(i);
        ++stats.sync_allreduces;
      }
    }
    for (auto& p : params)
      if (p.submitted) handles.push_back(p.handle);
  }
  double waited = 0;
  std::exception_ptr error;
  try {
    waited = wait_all(comm, handles);
  } catch (...) {
    error = std::current_exception();
  }
  std::lock_guard<std::mutex> lock(mu);
  // 2bit/1bit: the sum of every rank's codes, averaged as the allreduce would.
  const double post =
      o.op == collective::Reduction::kAverage ? o.gradient_predivide_factor / members : 1.0;
  for (auto& p : params) {
    if (!p.submitted) continue;
    try {
      if (!error && codes) {
        at::NoGradGuard no_grad;
        p.tensor.mutable_grad().copy_(
            codes->sum(comm.take_output(p.handle), members, p.tensor, post));
      } else if (!error && p.reduced.data_ptr() != p.tensor.grad().data_ptr()) {
        at::NoGradGuard no_grad;
        p.tensor.mutable_grad().copy_(p.reduced);
      }
    } catch (...) {  // other settings on another rank: reported once every parameter is reset
      if (!error) error = std::current_exception();
    }
    p.submitted = false;
    p.passes = 0;
    p.handle = Handle();
    p.reduced = at::Tensor();
  }
  stats.wait_seconds += waited;
  synced = submit_missing || synced;
  if (error) std::rethrow_exception(error);
}

// ---- DistributedOptimizer ----

DistributedOptimizer::DistributedOptimizer(::torch::optim::Optimizer& optimizer,
                                           NamedTensors named_parameters,
                                           Communicator& communicator,
                                           DistributedOptimizerOptions options)
    : impl_(std::make_unique<Impl>(optimizer, named_parameters, communicator, std::move(options))) {
}

DistributedOptimizer::DistributedOptimizer(::torch::optim::Optimizer& optimizer,
                                           NamedTensors named_parameters,
                                           DistributedOptimizerOptions options)
    : DistributedOptimizer(optimizer, std::move(named_parameters),
                           detail::default_communicator("DistributedOptimizer"),
                           std::move(options)) {}

DistributedOptimizer::~DistributedOptimizer() = default;

void DistributedOptimizer::step() {
  bool already;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    already = impl_->synced;
  }
  // After an explicit synchronize() only what a later backward started is waited for.
  impl_->synchronize(!already);
  impl_->opt.step();
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->synced = false;
  ++impl_->stats.steps;
}

void DistributedOptimizer::synchronize() {
  impl_->synchronize(true);
}

void DistributedOptimizer::zero_grad() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (const auto& p : impl_->params) {
      if (p.submitted) {
        throw InvalidArgument(
            "DistributedOptimizer::zero_grad: the allreduce of '" + p.name +
            "' is still running (zero_grad() after backward() but before step() or "
            "synchronize()); call step() or synchronize() first");
      }
    }
  }
  impl_->opt.zero_grad();
}

::torch::optim::Optimizer& DistributedOptimizer::optimizer() const {
  return impl_->opt;
}
Communicator& DistributedOptimizer::communicator() const {
  return impl_->comm;
}
size_t DistributedOptimizer::num_parameters() const {
  return impl_->params.size();
}
DistributedOptimizer::Stats DistributedOptimizer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace pushpull::torch
