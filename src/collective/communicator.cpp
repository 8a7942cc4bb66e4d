// SPDX-License-Identifier: Apache-2.0
// The public Communicator: argument checks, then the engine.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/flight_recorder.h"
#include "base/metrics.h"
#include "collective/engine.h"

namespace pushpull::collective {

using transport::Transport;

std::string_view reduction_name(Reduction r) {
  switch (r) {
    case Reduction::kSum:
      return "sum";
    case Reduction::kAverage:
      return "average";
    case Reduction::kMin:
      return "min";
    case Reduction::kMax:
      return "max";
    case Reduction::kProduct:
      return "product";
  }
  return "invalid";
}

CommunicatorOptions CommunicatorOptions::from(const Options& options) {
  CommunicatorOptions o;
  o.collective = options.collective;
  const Millis t = options.cluster.heartbeat_timeout;
  o.peer_timeout = t + std::max(Millis{3000}, t / 2);
  return o;
}

const std::string& Handle::name() const {
  static const std::string kNone;
  return state_ ? state_->name : kNone;
}

namespace {

void check_view(const ArrayView& a, std::string_view what, const std::string& name) {
  if (!a.device.is_cpu())
    throw InvalidArgument(fmt::format(
        "collective: '{}': {} is on {}; only host memory is supported", name, what, a.describe()));
  if (a.numel() > 0 && a.data == nullptr)
    throw InvalidArgument(fmt::format("collective: '{}': {} has no data", name, what));
}

void check_name(const std::string& name) {
  if (name.empty() || name.rfind("__", 0) == 0)
    throw InvalidArgument(fmt::format(
        "collective: op name '{}' is empty or starts with '__' (reserved); name each op", name));
}

// A process set's members: sorted, unique ranks of the group including this
// rank (empty: every rank).
std::vector<int32_t> checked_members(std::vector<int> members, int rank, int size,
                                     const std::string& name) {
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  if (!members.empty() && (members.front() < 0 || members.back() >= size))
    throw InvalidArgument(
        fmt::format("collective: '{}': process set rank {} is not a rank of the group (size {})",
                    name, members.front() < 0 ? members.front() : members.back(), size));
  if (!members.empty() && !std::binary_search(members.begin(), members.end(), rank))
    throw InvalidArgument(
        fmt::format("collective: '{}': rank {} is not in the process set [{}] it submitted to",
                    name, rank, fmt::join(members, ", ")));
  return {members.begin(), members.end()};
}

}  // namespace

Communicator::Communicator(std::unique_ptr<Transport> transport, CommunicatorOptions options) {
  if (!transport) throw InvalidArgument("collective: Communicator needs a transport");
  impl_ = std::make_unique<Impl>(std::move(transport), std::move(options));
}
Communicator::~Communicator() {
  shutdown();
}

int Communicator::rank() const {
  return impl_->rank();
}
int Communicator::size() const {
  return impl_->size();
}
int Communicator::local_rank() const {
  int v = impl_->options().collective.local_rank;
  return v >= 0 ? v : rank();
}
int Communicator::local_size() const {
  int v = impl_->options().collective.local_size;
  return v >= 0 ? v : size();
}

Handle Communicator::allreduce_async(std::string name, ArrayView input, ArrayView output,
                                     Reduction op, std::vector<int> members, double postscale) {
  check_name(name);
  if (!std::isfinite(postscale))
    throw InvalidArgument(
        fmt::format("collective: allreduce '{}': postscale {} is not finite", name, postscale));
  check_view(input, "input", name);
  check_view(output, "output", name);
  if (input.dtype != output.dtype || !(input.shape == output.shape))
    throw InvalidArgument(fmt::format("collective: allreduce '{}': output {} differs from input {}",
                                      name, output.describe(), input.describe()));
  Spec s{name,
         OpType::kAllreduce,
         input.dtype,
         op,
         0,
         input.shape,
         checked_members(std::move(members), rank(), size(), name)};
  s.postscale = postscale;
  return impl_->submit(std::move(s), input, output);
}
void Communicator::allreduce(std::string name, ArrayView input, ArrayView output, Reduction op) {
  wait(allreduce_async(std::move(name), input, output, op));
}

Handle Communicator::broadcast_async(std::string name, ArrayView data, int root,
                                     std::vector<int> members) {
  check_name(name);
  check_view(data, "data", name);
  if (root < 0 || root >= size())
    throw InvalidArgument(fmt::format("collective: broadcast '{}': root {} is not a rank (size {})",
                                      name, root, size()));
  Spec s{name,
         OpType::kBroadcast,
         data.dtype,
         Reduction::kSum,
         root,
         data.shape,
         checked_members(std::move(members), rank(), size(), name)};
  if (!s.includes(root))
    throw InvalidArgument(
        fmt::format("collective: broadcast '{}': root {} is not in the process set [{}]", s.name,
                    root, fmt::join(s.members, ", ")));
  return impl_->submit(std::move(s), data, data);
}
void Communicator::broadcast(std::string name, ArrayView data, int root) {
  wait(broadcast_async(std::move(name), data, root));
}

Handle Communicator::allgather_async(std::string name, ArrayView input, std::vector<int> members) {
  check_name(name);
  check_view(input, "input", name);
  Spec s{name,
         OpType::kAllgather,
         input.dtype,
         Reduction::kSum,
         0,
         input.shape,
         checked_members(std::move(members), rank(), size(), name)};
  return impl_->submit(std::move(s), input, input);
}
Array Communicator::allgather(std::string name, ArrayView input) {
  return take_output(allgather_async(std::move(name), input));
}

Handle Communicator::reduce_scatter_async(std::string name, ArrayView input, Reduction op,
                                          std::vector<int> members) {
  check_name(name);
  check_view(input, "input", name);
  Spec s{name,
         OpType::kReduceScatter,
         input.dtype,
         op,
         0,
         input.shape,
         checked_members(std::move(members), rank(), size(), name)};
  return impl_->submit(std::move(s), input, input);
}
Array Communicator::reduce_scatter(std::string name, ArrayView input, Reduction op) {
  return take_output(reduce_scatter_async(std::move(name), input, op));
}

Handle Communicator::barrier_async() {
  // Every rank calls barrier() in the same sequence, so a local count names it.
  static_assert(sizeof(uint64_t) == 8);
  Spec s{fmt::format("__barrier.{}", barrier_seq_++),
         OpType::kBarrier,
         DType::kUInt8,
         Reduction::kSum,
         0,
         Shape{},
         {}};
  return impl_->submit(std::move(s), ArrayView(), ArrayView());
}
void Communicator::barrier() {
  wait(barrier_async());
}

Handle Communicator::join_async() {
  return impl_->join();
}
int Communicator::join() {
  Handle h = join_async();
  wait(h);
  std::lock_guard lock(h.state_->mu);
  return h.state_->value;
}

bool Communicator::poll(const Handle& h) const {
  if (!h.valid()) throw InvalidArgument("collective: poll() of an empty handle");
  std::lock_guard lock(h.state_->mu);
  return h.state_->done;
}

void Communicator::wait(const Handle& h, std::optional<Millis> timeout) const {
  if (!h.valid()) throw InvalidArgument("collective: wait() on an empty handle");
  auto& s = *h.state_;
  Millis limit = timeout.value_or(impl_->options().wait_timeout);
  std::unique_lock lock(s.mu);
  // metrics hook: the time callers spend waiting for collectives
  const auto t0 = metrics::enabled() ? std::chrono::steady_clock::now()
                                     : std::chrono::steady_clock::time_point{};
  const bool done = s.cv.wait_for(lock, limit, [&] { return s.done; });
  PP_METRIC_ADD(kCollectiveWaitMicros, std::chrono::duration_cast<std::chrono::microseconds>(
                                           std::chrono::steady_clock::now() - t0)
                                           .count());
  if (!done) {
    const std::string what = fmt::format(
        "collective: '{}' on rank {} did not complete within {} ms; other ranks may not have "
        "submitted it (rank 0 logs stall warnings) or may be stuck",
        s.name, rank(), limit.count());
    lock.unlock();
    flight::dump("timeout: " + what);
    throw Timeout(what);
  }
  s.status.raise();
}

Array Communicator::take_output(const Handle& h, std::optional<Millis> timeout) const {
  wait(h, timeout);
  std::lock_guard lock(h.state_->mu);
  return std::move(h.state_->output);
}

Status Communicator::failure() const {
  return impl_ ? impl_->failure() : Status::ok();
}

void Communicator::shutdown() {
  if (impl_) impl_->shutdown();
}

}  // namespace pushpull::collective
