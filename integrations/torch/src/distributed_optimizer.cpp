// SPDX-License-Identifier: Apache-2.0
#include "pushpull/torch/distributed_optimizer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <unordered_map>

#include "pushpull/error.h"
#include "pushpull/frontend/gradient_reducer.h"
#include "pushpull/log.h"
#include "reducer_options.h"
#include "sparse_gradients.h"
#include "tensor_collectives.h"

namespace pushpull::torch {
namespace {

namespace autograd = ::torch::autograd;
using collective::Communicator;
using detail::describe;
using detail::layout_problem;
using detail::view_of;

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
    at::Tensor tensor;
    at::Tensor reduced;  // the view the reducer writes: .grad, or a contiguous copy of it
    // A sparse gradient's allgathers (the reducer does not see them); with
    // sparse_as_dense, `reduced` is its dense copy (densified), handed back sparse.
    detail::SparseGather gather;
    bool densified = false;
    int64_t sparse_dim = -1;  // the last sparse gradient's (sparse_as_dense: its hand-back)
    // > 0: every rank knows the gradient is sparse with this sparse_dim (declared,
    // or an earlier allgather of every rank's succeeded); 0: unknown.
    int64_t known_sparse_dim = 0;
    // Hooks.
    std::shared_ptr<autograd::Node> accumulator;
    uintptr_t post_id = 0;
    unsigned pre_id = 0;
    bool has_pre = false;
  };

  Impl(::torch::optim::Optimizer& o, const NamedTensors& named, Communicator& c,
       const DistributedOptimizerOptions& opts);
  ~Impl();
  void install_hooks();
  void submit(const std::vector<size_t>& ready);
  void submit_sparse(size_t i, const at::Tensor& g);
  void finish_sparse(std::exception_ptr& error);
  void synchronize(bool submit_missing);

  ::torch::optim::Optimizer& opt;
  Communicator& comm;
  std::vector<Param> params;
  std::vector<std::string> names;
  // The policy (frontend/gradient_reducer.h); here only tensors and hooks.
  std::unique_ptr<frontend::GradientReducer> reducer;
  const bool sparse_as_dense;
  // Sparse allgathers still reading after a failed synchronize() (the destructor waits).
  std::vector<detail::SparseGather> lingering;
  // Per parameter, this round: how this rank chose its kind without knowing (for errors).
  std::vector<detail::Guess> guessed;
  mutable std::mutex mu;  // params' reduced tensors and kinds, guessed, synced, steps
  bool synced = false;    // synchronize() ran since the last step()
  int64_t steps = 0;
};

DistributedOptimizer::Impl::Impl(::torch::optim::Optimizer& optimizer, const NamedTensors& named,
                                 Communicator& c, const DistributedOptimizerOptions& opts)
    : opt(optimizer), comm(c), sparse_as_dense(opts.sparse_as_dense) {
  std::unordered_map<const void*, std::string> name_of;
  for (const auto& [name, t] : named)
    if (t.defined()) name_of.emplace(t.unsafeGetTensorImpl(), name);
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
      params.emplace_back().tensor = p;
      names.push_back(it->second);
    }
  }
  // Duplicate names of named_parameters are refused even when unused.
  std::set<std::string> all;
  for (const auto& [name, t] : named) {
    if (!all.insert(name).second) {
      throw InvalidArgument("DistributedOptimizer: the name '" + name +
                            "' appears twice in named_parameters; names must be unique (they "
                            "name the allreduces on every rank)");
    }
  }
  reducer = std::make_unique<frontend::GradientReducer>(comm, names,
                                                        detail::reducer_options(opts, names));
  const auto known = detail::declared_sparse_dims(
      names, sparse_as_dense ? std::vector<std::string>{} : opts.sparse_parameters, named);
  for (size_t i = 0; i < params.size(); ++i)
    params[i].known_sparse_dim = known[i];
  guessed.assign(params.size(), detail::Guess::kNone);
  install_hooks();
}

DistributedOptimizer::Impl::~Impl() {
  for (auto& p : params) {
    if (p.accumulator) p.accumulator->del_post_hook(p.post_id);
    if (p.has_pre) p.tensor.remove_hook(p.pre_id);
    if (p.gather.started()) detail::wait_sparse_gather(comm, p.gather);
  }
  for (const auto& g : lingering)
    detail::wait_sparse_gather(comm, g);
  reducer.reset();  // waits for reductions still writing into the tensors below
}

void DistributedOptimizer::Impl::install_hooks() {
  for (size_t i = 0; i < params.size(); ++i) {
    Param& p = params[i];
    // Before accumulation: a pass too many is refused before it touches a
    // gradient that is being reduced.
    p.pre_id =
        p.tensor.register_hook([this, i](const at::Tensor&) { reducer->before_accumulate(i); });
    p.has_pre = true;
    p.accumulator = autograd::impl::grad_accumulator(p.tensor);
    if (p.accumulator) {
      p.post_id = p.accumulator->add_post_hook(
          std::make_unique<GradReadyHook>([this, i] { submit(reducer->grad_ready(i)); }));
    }
  }
}

// Checks a gradient before the reducer sees it ("" when fine).
static std::string grad_problem(const at::Tensor& g, const at::Tensor& param) {
  std::string problem = layout_problem(g, false);
  if (problem.empty() && (g.sizes() != param.sizes() || g.scalar_type() != param.scalar_type()))
    problem = "but the parameter is " + describe(param);
  return problem;
}

// The reducer handed these parameters out: their gradients as views. On an
// error the rest go back to the reducer (synchronize() submits them).
void DistributedOptimizer::Impl::submit(const std::vector<size_t>& ready) {
  std::lock_guard<std::mutex> lock(mu);
  for (size_t k = 0; k < ready.size(); ++k) {
    Param& p = params[ready[k]];
    try {
      const int64_t known = sparse_as_dense ? 0 : p.known_sparse_dim;
      const at::Tensor& g0 = p.tensor.grad();
      if (known > 0 && (!g0.defined() || !g0.is_sparse())) {
        // Sparse on the other ranks (every rank knows it): no gradient is an
        // empty sparse one, a dense one goes as its nonzero rows.
        p.tensor.mutable_grad() =
            g0.defined() ? g0.to_sparse(known) : detail::empty_sparse_like(p.tensor, known);
      } else if (!g0.defined()) {
        // Unused on this rank (maybe used on another): contribute zeros, so every
        // rank submits every name (Horovod does the same); sparse ones on another
        // rank meet them under this name and fail at once (explain_mismatch).
        const bool sparse = sparse_as_dense && p.sparse_dim > 0;
        p.tensor.mutable_grad() =
            sparse ? detail::empty_sparse_like(p.tensor, p.sparse_dim) : at::zeros_like(p.tensor);
        if (!sparse_as_dense) guessed[ready[k]] = detail::Guess::kDenseZeros;
      }
      const at::Tensor& g = p.tensor.grad();
      if (g.is_sparse()) {
        if (known == 0 && !sparse_as_dense) guessed[ready[k]] = detail::Guess::kSparse;
        submit_sparse(ready[k], g);
        continue;
      }
      if (auto problem = grad_problem(g, p.tensor); !problem.empty()) {
        throw InvalidArgument("DistributedOptimizer: the gradient of '" + names[ready[k]] + "', " +
                              describe(g) + ", " + problem);
      }
      p.reduced = g.is_contiguous() ? g : g.contiguous();
      reducer->submit(ready[k], view_of(p.reduced));
    } catch (...) {
      p.reduced = at::Tensor();
      p.densified = false;
      for (size_t j = k; j < ready.size(); ++j)
        reducer->hand_back(ready[j]);
      throw;
    }
  }
}

// Under mu (from submit): a sparse gradient's densified reduction or allgathers.
void DistributedOptimizer::Impl::submit_sparse(size_t i, const at::Tensor& g) {
  Param& p = params[i];
  if (auto problem = detail::sparse_grad_problem(g, p.tensor); !problem.empty()) {
    throw InvalidArgument("DistributedOptimizer: the sparse gradient of '" + names[i] + "', " +
                          describe(g) + ", " + problem);
  }
  p.sparse_dim = g.sparse_dim();
  if (sparse_as_dense) {
    p.reduced = g.to_dense();
    p.densified = true;
    reducer->submit(i, view_of(p.reduced));
    return;
  }
  // op is kAverage or kSum: the reducer refused the others at construction.
  p.gather =
      detail::start_sparse_gather(comm, reducer->op_name(i), g, reducer->options().process_set);
}

// The sparse allgathers: waited for without the lock (hooks may run), then
// their sums become the gradients (on no earlier error), and the reducer
// releases the parameters. `error` keeps the first error.
void DistributedOptimizer::Impl::finish_sparse(std::exception_ptr& error) {
  std::vector<std::pair<size_t, detail::SparseGather>> gathers;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].gather.started()) continue;
      gathers.emplace_back(i, std::move(params[i].gather));
      params[i].gather = {};
    }
  }
  if (gathers.empty()) return;
  const double scale = detail::sparse_scale(reducer->options(), reducer->members());
  std::vector<at::Tensor> sums(gathers.size());
  for (size_t k = 0; k < gathers.size(); ++k)
    sums[k] = detail::finish_sparse_gather(comm, gathers[k].second, scale, error);
  std::lock_guard<std::mutex> lock(mu);
  for (size_t k = 0; k < gathers.size(); ++k) {
    auto& [i, g] = gathers[k];
    if (!error) params[i].tensor.mutable_grad() = sums[k];
    if (sums[k].defined()) params[i].known_sparse_dim = g.sparse_dim;   // every rank's was sparse
    if (detail::in_flight(comm, g)) lingering.push_back(std::move(g));  // after a Timeout
    reducer->finish_external(i);
  }
}

void DistributedOptimizer::Impl::synchronize(bool submit_missing) {
  if (!reducer->active()) {
    // Outside the process set: the optimizer is local; only the passes
    // of accumulated gradients are averaged, as a member's would be.
    if (submit_missing && reducer->local_scale() != 1.0) {
      at::NoGradGuard no_grad;
      for (auto& p : params)
        if (p.tensor.grad().defined()) p.tensor.mutable_grad().mul_(reducer->local_scale());
    }
    reducer->synchronize();
    std::lock_guard<std::mutex> lock(mu);
    synced = submit_missing || synced;
    return;
  }
  if (submit_missing) {
    // Check every gradient before submitting any, so a bad one starts nothing.
    {
      std::lock_guard<std::mutex> lock(mu);
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& g = params[i].tensor.grad();
        if (params[i].reduced.defined() || params[i].gather.started() || !g.defined()) continue;
        if (auto problem = g.is_sparse() ? detail::sparse_grad_problem(g, params[i].tensor)
                                         : grad_problem(g, params[i].tensor);
            !problem.empty()) {
          throw InvalidArgument("DistributedOptimizer: the gradient of '" + names[i] + "', " +
                                describe(g) + ", " + problem);
        }
      }
    }
    submit(reducer->take_unsubmitted());
  }
  std::exception_ptr error;
  try {
    reducer->synchronize();
  } catch (...) {
    error = std::current_exception();
  }
  finish_sparse(error);
  std::lock_guard<std::mutex> lock(mu);
  for (auto& p : params) {
    if (!error && p.densified) {
      // As Horovod's sparse_as_dense: the optimizer gets a sparse gradient back.
      p.tensor.mutable_grad() = p.reduced.to_sparse(p.sparse_dim);
    } else if (!error && p.reduced.defined() &&
               p.reduced.data_ptr() != p.tensor.grad().data_ptr()) {
      at::NoGradGuard no_grad;
      p.tensor.mutable_grad().copy_(p.reduced);
    }
    p.reduced = at::Tensor();
    p.densified = false;
  }
  synced = submit_missing || synced;
  if (error) error = detail::explain_mismatch(error, guessed, *reducer);
  guessed.assign(params.size(), detail::Guess::kNone);
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
  ++impl_->steps;
}

void DistributedOptimizer::synchronize() {
  impl_->synchronize(true);
}

void DistributedOptimizer::zero_grad() {
  if (impl_->reducer->pending()) {
    throw InvalidArgument(
        "DistributedOptimizer::zero_grad: allreduces are still running (zero_grad() after "
        "backward() but before step() or synchronize()); call step() or synchronize() first");
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
  const auto r = impl_->reducer->stats();
  std::lock_guard<std::mutex> lock(impl_->mu);
  return {.steps = impl_->steps,
          .hook_allreduces = r.hook_reductions,
          .sync_allreduces = r.sync_reductions,
          .wait_seconds = r.wait_seconds};
}

}  // namespace pushpull::torch
