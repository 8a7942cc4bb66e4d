// SPDX-License-Identifier: Apache-2.0
#include "work.h"

#include <ATen/core/ivalue.h>
#include <fmt/format.h>

#include <algorithm>

#include "pushpull/error.h"

namespace pushpull::torch_pg {
namespace {

using Clock = PushpullWork::Clock;

Millis remaining(Clock::time_point until) {
  return std::max(Millis(0), std::chrono::ceil<Millis>(until - Clock::now()));
}

}  // namespace

PushpullWork::PushpullWork(std::shared_ptr<collective::Session> session,
                           std::vector<collective::Handle> handles, Finisher finisher,
                           std::vector<at::Tensor> keep_alive, std::vector<at::Tensor> result,
                           Clock::time_point deadline, std::string what, int rank,
                           c10d::OpType type, const char* profiling_title,
                           const std::vector<at::Tensor>& inputs)
    : c10d::Work(rank, type, profiling_title, c10::optional<std::vector<at::Tensor>>(inputs)),
      session_(std::move(session)),
      handles_(std::move(handles)),
      finisher_(std::move(finisher)),
      keep_alive_(std::move(keep_alive)),
      result_(std::move(result)),
      deadline_(deadline),
      submitted_(Clock::now()),
      what_(std::move(what)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

bool PushpullWork::engine_done() const {
  auto& comm = session_->communicator();
  return std::all_of(handles_.begin(), handles_.end(),
                     [&](const collective::Handle& h) { return comm.poll(h); });
}

PushpullWork::Waited PushpullWork::wait_engine(Clock::time_point until, std::exception_ptr* error) {
  auto& comm = session_->communicator();
  for (const auto& h : handles_) {
    try {
      comm.wait(h, remaining(until));
    } catch (...) {
      if (!comm.poll(h)) return Waited::kExpired;  // our deadline, not the op's error
      // Done: its own result (a wait that timed out just as the op finished
      // may have thrown our Timeout instead of the op's outcome).
      try {
        comm.wait(h, Millis(0));
      } catch (...) {
        if (!*error) *error = std::current_exception();
      }
    }
  }
  return Waited::kDone;
}

void PushpullWork::finalize(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(finalize_mu_);
    if (finalized_) return;
    finalized_ = true;
  }
  if (!error && finisher_) {
    try {
      finisher_();
    } catch (...) {
      error = std::current_exception();
    }
  }
  finisher_ = nullptr;
  finish(error);  // c10d::Work: completed, waiters woken
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(result_));
  }
}

bool PushpullWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return true;
  }
  if (!engine_done()) return false;
  std::exception_ptr error;
  if (wait_engine(Clock::now(), &error) == Waited::kDone) finalize(error);
  // Another thread may be finalizing: completed once it has.
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool PushpullWork::complete_by_deadline() {
  std::exception_ptr error;
  if (wait_engine(deadline_, &error) == Waited::kDone) {
    finalize(error);
    return true;
  }
  const auto waited = std::chrono::duration_cast<Millis>(Clock::now() - submitted_);
  finalize(std::make_exception_ptr(Timeout(fmt::format(
      "pushpull ProcessGroup: {} did not complete within {} ms (the process group's timeout, "
      "init_process_group(timeout=...)); some rank did not call it or is far behind",
      what_, waited.count()))));
  return engine_done();
}

bool PushpullWork::wait(std::chrono::milliseconds timeout) {
  const Clock::time_point until =
      timeout == kNoTimeout ? deadline_ : std::min(deadline_, Clock::now() + timeout);
  std::exception_ptr error;
  if (wait_engine(until, &error) == Waited::kDone) {
    finalize(error);
  } else if (until == deadline_) {
    complete_by_deadline();  // fails the work with Timeout; the completer keeps it alive
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!completed_) {
      throw Timeout(fmt::format(
          "pushpull ProcessGroup: wait(timeout={} ms) on {} expired; the operation goes on",
          timeout.count(), what_));
    }
  }
  return c10d::Work::wait(kNoTimeout);  // rethrows the op's error
}

}  // namespace pushpull::torch_pg
