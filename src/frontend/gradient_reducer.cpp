// SPDX-License-Identifier: Apache-2.0
// GradientReducer's round: readiness, submission, the wait and the results
// (gradient_reducer.h). Construction and checks: reducer_setup.cpp.
#include "pushpull/frontend/gradient_reducer.h"

#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <span>

#include "pushpull/kernels.h"
#include "pushpull/log.h"
#include "reducer_impl.h"

namespace pushpull::frontend {
namespace {

using collective::Reduction;

bool is_float(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}

}  // namespace

GradientReducer::GradientReducer(collective::Communicator& comm, std::vector<std::string> names,
                                 ReducerOptions options)
    : GradientReducer([&comm]() -> collective::Communicator& { return comm; }, std::move(names),
                      std::move(options)) {}

GradientReducer::GradientReducer(CommunicatorFn comm, std::vector<std::string> names,
                                 ReducerOptions options)
    : impl_(std::make_unique<Impl>(std::move(comm), std::move(names), std::move(options))) {}

GradientReducer::~GradientReducer() {
  // No reduction may write into a gradient (or our copies) after we are gone.
  std::vector<collective::Handle> pending;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& p : impl_->params)
      if (p.submitted) pending.push_back(p.handle);
    for (auto& l : impl_->lingering)
      pending.push_back(l.handle);
  }
  if (pending.empty()) return;
  collective::Communicator* comm = nullptr;
  try {
    comm = &impl_->comm();
  } catch (const std::exception&) {
    return;  // the session is gone: it failed its operations when it shut down
  }
  for (auto& h : pending) {
    try {
      comm->wait(h);
    } catch (const std::exception& e) {
      PP_WARN("{}: a reduction in flight at destruction failed: {}", impl_->o.who, e.what());
    }
  }
}

size_t GradientReducer::size() const {
  return impl_->params.size();
}
const std::string& GradientReducer::name(size_t i) const {
  return impl_->params.at(i).name;
}
const std::string& GradientReducer::op_name(size_t i) const {
  return impl_->params.at(i).op_name;
}
const ReducerOptions& GradientReducer::options() const {
  return impl_->o;
}
bool GradientReducer::member() const {
  return impl_->member;
}
int GradientReducer::members() const {
  return impl_->set_size();
}
bool GradientReducer::active() const {
  return impl_->member && (impl_->o.reduce_alone || impl_->set_size() > 1);
}
double GradientReducer::local_scale() const {
  const auto& o = impl_->o;
  return o.average_aggregated_gradients && o.backward_passes_per_step > 1
             ? 1.0 / o.backward_passes_per_step
             : 1.0;
}
int GradientReducer::group_of(size_t i) const {
  return impl_->params.at(i).group;
}

void GradientReducer::before_accumulate(size_t i) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const auto& p = impl_->params.at(i);
  if (p.claimed) {
    throw InvalidArgument(fmt::format(
        "{}: parameter '{}' got a gradient from more than backward_passes_per_step={} backward "
        "pass(es) before step(); its reduction is already running. Call step() (or "
        "synchronize()) after every backward_passes_per_step backward passes, or increase "
        "backward_passes_per_step to accumulate gradients locally",
        impl_->o.who, p.name, impl_->o.backward_passes_per_step));
  }
}

std::vector<size_t> GradientReducer::Impl::claim_group(int g, bool from_hook) {
  std::vector<size_t> out;
  for (size_t j : groups[g]) {
    if (params[j].claimed) continue;
    params[j].claimed = true;
    out.push_back(j);
  }
  group_ready[g] = 0;
  (from_hook ? stats.hook_reductions : stats.sync_reductions) += static_cast<int64_t>(out.size());
  return out;
}

std::vector<size_t> GradientReducer::grad_ready(size_t i) {
  if (!active()) return {};
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& p = impl_->params.at(i);
  if (p.claimed || ++p.passes < impl_->o.backward_passes_per_step) return {};
  if (p.group < 0) {
    p.claimed = true;
    ++impl_->stats.hook_reductions;
    return {i};
  }
  // A group starts once every member had its last pass.
  if (++impl_->group_ready[p.group] < impl_->groups[p.group].size()) return {};
  return impl_->claim_group(p.group, true);
}

std::vector<size_t> GradientReducer::take_unsubmitted() {
  std::vector<size_t> out;
  if (!active()) return out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (size_t i = 0; i < impl_->params.size(); ++i) {
    auto& p = impl_->params[i];
    if (p.claimed) continue;
    if (p.group >= 0) {  // the whole group, in its order
      for (size_t j : impl_->claim_group(p.group, false))
        out.push_back(j);
      continue;
    }
    p.claimed = true;
    ++impl_->stats.sync_reductions;
    out.push_back(i);
  }
  return out;
}

void GradientReducer::submit(size_t i, ArrayView grad) {
  auto& o = impl_->o;
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& p = impl_->params.at(i);
  if (p.submitted) {
    throw InvalidArgument(fmt::format("{}: '{}' was submitted twice in one step", o.who, p.name));
  }
  if (!is_float(grad.dtype) || grad.device != Device::cpu() || grad.data == nullptr) {
    p.claimed = false;
    throw InvalidArgument(
        fmt::format("{}: the gradient of '{}' is {}; the reductions need a CPU "
                    "float32/64, float16 or bfloat16 array",
                    o.who, p.name, grad.describe()));
  }
  const auto n = static_cast<size_t>(grad.numel());
  double scale = 1.0 / o.gradient_predivide_factor;
  if (o.average_aggregated_gradients && o.backward_passes_per_step > 1)
    scale /= o.backward_passes_per_step;
  // kAverage as a sum times factor / ranks: a joined rank counts as zeros.
  const double post =
      o.op == Reduction::kAverage ? o.gradient_predivide_factor / impl_->set_size() : 1.0;
  try {
    if (impl_->codes) {  // 2bit/1bit: codes cannot be summed on the way; every rank sums all
      Array f(grad.shape, DType::kFloat32);
      convert(DType::kFloat32, f.data(), grad.dtype, grad.data, n);
      if (scale != 1.0) pushpull::scale(DType::kFloat32, f.data(), scale, n);
      Array c(Shape{static_cast<int64_t>(impl_->codes->encoded_bytes(n))}, DType::kUInt8);
      impl_->codes->encode(i, f.as<float>(), n, static_cast<std::byte*>(c.data()));
      p.handle = impl_->comm().allgather_async(p.op_name, c.view(), o.process_set);
      p.work = std::move(c);
    } else {
      ArrayView target = grad;
      const bool fp16 = o.compression == GradCompression::kFp16 &&
                        (grad.dtype == DType::kFloat32 || grad.dtype == DType::kFloat64);
      if (fp16) {  // a half-size copy travels; synchronize() converts back
        p.work = Array(grad.shape, DType::kFloat16);
        convert(DType::kFloat16, p.work.data(), grad.dtype, grad.data, n);
        target = p.work.view();
      }
      if (scale != 1.0) pushpull::scale(target.dtype, target.data, scale, n);
      p.handle = impl_->comm().allreduce_async(p.op_name, target, target, Reduction::kSum,
                                               o.process_set, post);
    }
  } catch (...) {
    p.work = Array();
    p.claimed = false;
    throw;
  }
  p.grad = grad;
  p.submitted = true;
}

void GradientReducer::hand_back(size_t i) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& p = impl_->params.at(i);
  if (!p.submitted) p.claimed = false;
}

void GradientReducer::finish_external(size_t i) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->reset(impl_->params.at(i));
}

void GradientReducer::Impl::reset(Param& p) {
  p.passes = 0;
  p.claimed = false;
  p.submitted = false;
  p.grad = ArrayView();
  p.work = Array();
  p.handle = collective::Handle();
}

void GradientReducer::Impl::finish(Param& p) {
  const auto n = static_cast<size_t>(p.grad.numel());
  if (codes) {
    Array gathered = comm().take_output(p.handle);
    const int members = set_size();
    Array sum(p.grad.shape, DType::kFloat32);
    codes->sum_gathered(std::span<const std::byte>(static_cast<const std::byte*>(gathered.data()),
                                                   gathered.nbytes()),
                        members, n, sum.as<float>());
    const double post = o.op == Reduction::kAverage ? o.gradient_predivide_factor / members : 1.0;
    if (post != 1.0) scale(DType::kFloat32, sum.data(), post, n);
    convert(p.grad.dtype, p.grad.data, DType::kFloat32, sum.data(), n);
  } else if (!p.work.empty()) {
    convert(p.grad.dtype, p.grad.data, p.work.dtype(), p.work.data(), n);
  }
}

double GradientReducer::synchronize() {
  auto& m = *impl_;
  std::vector<size_t> mine;
  std::vector<collective::Handle> handles;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!active()) {  // local steps: only the passes are counted
      for (auto& p : m.params)
        m.reset(p);
      return 0;
    }
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (!m.params[i].submitted) continue;
      mine.push_back(i);
      handles.push_back(m.params[i].handle);
    }
  }
  // Every handle is waited for, even after a failure, so nothing is left
  // writing into a view; no lock is held meanwhile (hooks may run).
  const auto t0 = std::chrono::steady_clock::now();
  std::exception_ptr error;
  for (const auto& h : handles) {
    try {
      m.comm().wait(h);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(m.mu);
  for (size_t i : mine) {
    auto& p = m.params[i];
    try {
      if (!error) m.finish(p);
    } catch (...) {  // other settings on another rank: reported once every parameter is reset
      error = std::current_exception();
    }
    if (error && !m.comm().poll(p.handle)) m.lingering.push_back({p.handle, std::move(p.work)});
    m.reset(p);
  }
  m.stats.wait_seconds += waited;
  if (error) std::rethrow_exception(error);
  return waited;
}

void GradientReducer::abandon_round() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& p : impl_->params) {
    if (p.submitted) impl_->lingering.push_back({p.handle, std::move(p.work)});
    impl_->reset(p);
  }
  impl_->group_ready.assign(impl_->groups.size(), 0);
}

bool GradientReducer::in_flight() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& l = impl_->lingering;
  std::erase_if(l, [&](const Impl::Lingering& x) { return impl_->comm().poll(x.handle); });
  if (!l.empty()) return true;
  for (const auto& p : impl_->params)
    if (p.submitted && !impl_->comm().poll(p.handle)) return true;
  return false;
}

bool GradientReducer::pending() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& p : impl_->params)
    if (p.claimed || p.submitted) return true;
  return false;
}

GradientReducer::Stats GradientReducer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace pushpull::frontend
