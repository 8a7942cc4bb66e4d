// SPDX-License-Identifier: Apache-2.0
#include "process_group.h"

#include <fmt/format.h>

#include <utility>

#include "meet.h"
#include "pushpull/error.h"
#include "tensors.h"

namespace pushpull::torch_pg {
namespace {

using collective::Handle;
using detail::Unsupported;

std::function<void(const std::function<void()>&)>& blocking_region() {
  static std::function<void(const std::function<void()>&)> f;
  return f;
}

}  // namespace

void ProcessGroupPushpull::set_blocking_region(
    std::function<void(const std::function<void()>&)> f) {
  blocking_region() = std::move(f);
}

ProcessGroupPushpull::ProcessGroupPushpull(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout)
    : ProcessGroupPushpull(meet(store, rank, size), timeout) {}

ProcessGroupPushpull::ProcessGroupPushpull(std::shared_ptr<collective::Session> session,
                                           std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(session->rank(), session->size()),
      session_(std::move(session)),
      timeout_(timeout) {
  init();  // c10d's logging of the new group
}

ProcessGroupPushpull::~ProcessGroupPushpull() {
  shutdown();
}

std::string ProcessGroupPushpull::mode() const {
  return std::string(session_->mode());
}

void ProcessGroupPushpull::shutdown() {
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    shut_ = true;
  }
  auto body = [this] {
    session_->shutdown();  // pending ops fail at once; the engine thread ends
    completer_.stop();     // finishes (fails) what is queued
  };
  if (blocking_region()) {
    blocking_region()(body);
  } else {
    body();
  }
}

std::string ProcessGroupPushpull::next_name(const std::string& signature) {
  const uint64_t n = counters_[signature]++;
  std::string name = fmt::format("{}#{}", signature, n % kSlots);
  auto it = last_by_name_.find(name);
  if (it != last_by_name_.end()) {
    auto& comm = session_->communicator();
    if (!comm.poll(it->second)) {
      // kSlots ops of this signature in flight: the oldest must finish before
      // its name is reused. Every rank has submitted it (same order), so it ends.
      try {
        comm.wait(it->second, timeout_);
      } catch (const Timeout&) {
        if (!comm.poll(it->second)) throw;
      } catch (const Error&) {
        // That op's own failure, reported by its work.
      }
    }
  }
  return name;
}

void ProcessGroupPushpull::remember(const std::string& name, const Handle& h) {
  last_by_name_[name] = h;
  if (last_by_name_.size() > 4096) {
    auto& comm = session_->communicator();
    std::erase_if(last_by_name_, [&](const auto& kv) { return comm.poll(kv.second); });
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::launch(
    c10d::OpType type, const char* title, std::string what, const std::vector<at::Tensor>& inputs,
    std::vector<at::Tensor> keep_alive, std::vector<at::Tensor> result,
    const std::function<Submitted()>& submit) {
  const auto deadline = PushpullWork::Clock::now() + timeout_;
  std::lock_guard<std::mutex> lock(submit_mu_);
  if (shut_) {
    throw Unsupported(fmt::format(
        "pushpull ProcessGroup: {} after the process group was shut down (destroy_process_group)",
        what));
  }
  Submitted s = submit();
  auto work = c10::make_intrusive<PushpullWork>(
      session_, std::move(s.handles), std::move(s.finisher), std::move(keep_alive),
      std::move(result), deadline, std::move(what), rank_, type, title, inputs);
  completer_.add(work);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::done_now(c10d::OpType type,
                                                              std::vector<at::Tensor> result) {
  auto work = c10::make_intrusive<PushpullWork>(
      session_, std::vector<Handle>{}, nullptr, std::vector<at::Tensor>{}, std::move(result),
      PushpullWork::Clock::now() + timeout_, "an empty operation", rank_, type, nullptr,
      std::vector<at::Tensor>{});
  work->complete_by_deadline();
  return work;
}

}  // namespace pushpull::torch_pg
