// SPDX-License-Identifier: Apache-2.0
// ProcessGroupPushpull: a torch.distributed (c10d) process group whose
// collectives run on pushpull's engine (include/pushpull/collective.h):
// pushpull's transports, algorithms, fusion, authentication and failure
// detection under DDP and the torch.distributed calls. Python registers it
// as backend "pushpull" (python/pushpull/torch/distributed.py).
//
// Meeting (meet.h): the ranks trade their mesh addresses through the c10d
// store itself (collective::Store's key protocol) and build a
// collective::Session with the group's rank and size and everything else
// from the environment (job secret and id, heartbeats, fusion;
// Options::from_env), so the group is authenticated like the rest of
// pushpull's job.
//
// Operations: allreduce (sum, avg, min, max, product), allreduce_coalesced,
// broadcast, reduce, allgather, _allgather_base, gather, reduce_scatter,
// _reduce_scatter_base, alltoall_base / alltoall (equal splits, over
// allgather), barrier; one dense CPU tensor per rank and call, of float32,
// float64, float16, bfloat16, int32, int64, int8 or uint8. Anything else is
// a std::runtime_error (RuntimeError in Python) saying what to do.
// Every call returns at once with a PushpullWork (work.h).
//
// Op names: the engine matches ops by name; a c10d op is named by its kind,
// dtype and reduction/root plus a slot (0..kSlots-1) counted per such
// signature, so the names agree on every rank (c10d calls are made in the
// same order everywhere) and repeat from step to step. Sizes are not part
// of the name: ranks passing different sizes get the engine's
// InvalidArgument naming every rank's shape, not a hang.
//
// Thread safety: every method may be called from any thread (c10d requires
// the ranks to issue collectives in the same order). Ownership: owns its
// Session (shared with the works, which may outlive the group) and its
// completer thread. The destructor shuts the session down (pending ops fail
// on every rank) and joins the thread.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "completer.h"
#include "pushpull/collective.h"
#include "work.h"

namespace pushpull::torch_pg {

class ProcessGroupPushpull final : public c10d::ProcessGroup {
 public:
  static constexpr const char* kBackendName = "pushpull";
  static constexpr int kSlots = 16;

  // Meets the other ranks through `store` (blocks up to the startup timeout,
  // PUSHPULL_STARTUP_TIMEOUT_MS). `timeout` bounds every operation.
  ProcessGroupPushpull(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout);
  // Over an existing session (tests, C++ programs).
  ProcessGroupPushpull(std::shared_ptr<collective::Session> session,
                       std::chrono::milliseconds timeout);
  ~ProcessGroupPushpull() override;

  const std::string getBackendName() const override { return kBackendName; }
  // "rendezvous" or "single".
  std::string mode() const;
  // Shuts the session down (local; peers with pending ops see PeerFailure)
  // and finishes every work. Later calls are refused. Idempotent.
  void shutdown();

  // Runs the blocking part of the destructor and shutdown(): the Python
  // module sets it to release the GIL, which future callbacks on the
  // completer thread may need.
  static void set_blocking_region(std::function<void(const std::function<void()>&)> f);

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  // What an operation hands to launch(): its engine handles, and what to do
  // once they succeeded.
  struct Submitted {
    std::vector<collective::Handle> handles;
    PushpullWork::Finisher finisher;
  };
  // Under submit_mu_: runs `submit`, wraps the result in a work, queues it.
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const char* title, std::string what,
                                        const std::vector<at::Tensor>& inputs,
                                        std::vector<at::Tensor> keep_alive,
                                        std::vector<at::Tensor> result,
                                        const std::function<Submitted()>& submit);
  // A work that is complete at once (nothing to exchange, e.g. empty tensors).
  c10::intrusive_ptr<c10d::Work> done_now(c10d::OpType type, std::vector<at::Tensor> result);
  // The engine name for the next op with `signature` (under submit_mu_);
  // waits for that name's previous op when it is still pending.
  std::string next_name(const std::string& signature);
  void remember(const std::string& name, const collective::Handle& h);
  // The submission of a reduce-scatter of `buf` (this rank's block lands in
  // `out`), shared by reduce_scatter and _reduce_scatter_base; under submit_mu_.
  Submitted submit_reduce_scatter(const std::string& signature, const at::Tensor& buf,
                                  const at::Tensor& out, collective::Reduction op);

  std::shared_ptr<collective::Session> session_;
  const std::chrono::milliseconds timeout_;
  Completer completer_;

  std::mutex submit_mu_;
  bool shut_ = false;                                       // guarded by submit_mu_
  std::map<std::string, uint64_t> counters_;                // guarded by submit_mu_
  std::map<std::string, collective::Handle> last_by_name_;  // guarded by submit_mu_
};

}  // namespace pushpull::torch_pg
