// SPDX-License-Identifier: Apache-2.0
// PushpullWork: the c10d::Work (and its Future) of one ProcessGroupPushpull
// operation, over the engine's Handles.
//
// Completion: the first thread to see the engine finish "finalizes" the
// work: it runs the op's finisher (copying results into the caller's
// tensors), completes the c10d::Work and then the Future (whose callbacks,
// e.g. a DDP comm hook's `then`, run in that thread). That thread is the
// process group's completer thread (completer.h) or any caller of wait() /
// isCompleted(), so a callback that waits on another work never depends on
// the completer being free.
//
// Deadline: every work has one (its submission time plus the process
// group's timeout). A work still running then fails with Timeout; the
// engine may still use its tensors, so the completer keeps the work (and
// the tensors it holds) alive until engine_done().
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pushpull/collective.h"

namespace pushpull::torch_pg {

class PushpullWork : public c10d::Work {
 public:
  using Clock = std::chrono::steady_clock;
  // Runs once after the engine completed every handle successfully.
  using Finisher = std::function<void()>;

  // `session` keeps the engine alive for as long as the work exists;
  // `keep_alive` holds every tensor the engine reads or writes; `result` is
  // the Future's value (a list of tensors). `what` names the op in errors.
  PushpullWork(std::shared_ptr<collective::Session> session,
               std::vector<collective::Handle> handles, Finisher finisher,
               std::vector<at::Tensor> keep_alive, std::vector<at::Tensor> result,
               Clock::time_point deadline, std::string what, int rank, c10d::OpType type,
               const char* profiling_title, const std::vector<at::Tensor>& inputs);

  bool isCompleted() override;
  // Waits for the engine (at most `timeout`, kNoTimeout: until the work's
  // deadline), then throws the op's error or returns true.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return result_; }
  void synchronize() override {}

  // For the completer: waits until the deadline, finalizes (success, the
  // op's error, or Timeout) and returns engine_done().
  bool complete_by_deadline();
  // True once the engine no longer touches the tensors.
  bool engine_done() const;

 private:
  enum class Waited { kDone, kExpired };
  // Waits for every handle until `until`; kDone (with the first error in
  // *error) once the engine finished them all.
  Waited wait_engine(Clock::time_point until, std::exception_ptr* error);
  void finalize(std::exception_ptr error);

  std::shared_ptr<collective::Session> session_;
  const std::vector<collective::Handle> handles_;
  Finisher finisher_;
  const std::vector<at::Tensor> keep_alive_;
  const std::vector<at::Tensor> result_;
  const Clock::time_point deadline_;
  const Clock::time_point submitted_;
  const std::string what_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;

  std::mutex finalize_mu_;
  bool finalized_ = false;  // guarded by finalize_mu_
};

}  // namespace pushpull::torch_pg
