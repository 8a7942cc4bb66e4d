// SPDX-License-Identifier: Apache-2.0
// Several devices per worker: one model replica per device, each running its
// slice of the batch in its own thread (CPU "devices" here, as MXNet's
// mx.cpu(i) contexts), with the gradients summed by the KVStore's list
// semantics (see Trainer).
//
// Ownership: ReplicaRunner owns num_devices - 1 threads (device 0 runs on the
// caller); the destructor stops and joins them.
// Thread safety: run() from one thread at a time.
// Blocking: run() blocks until every device's function returned. It waits on
// local computation only, never on a peer (store calls made inside `fn` have
// their own deadlines), so it has no deadline of its own.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace pushpull::torch {

class ReplicaRunner {
 public:
  // Throws InvalidArgument unless num_devices >= 1.
  explicit ReplicaRunner(int num_devices);
  ~ReplicaRunner();
  ReplicaRunner(const ReplicaRunner&) = delete;
  ReplicaRunner& operator=(const ReplicaRunner&) = delete;

  int num_devices() const { return num_devices_; }
  // Runs fn(d) for every device d in parallel. If some throw, the others still
  // finish, then the exception of the lowest device is rethrown.
  void run(const std::function<void(int device)>& fn);

 private:
  void loop(int device);

  int num_devices_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int)>* job_ = nullptr;  // guarded by mu_
  uint64_t generation_ = 0;                        // guarded by mu_
  int pending_ = 0;                                // guarded by mu_
  bool stop_ = false;                              // guarded by mu_
  std::vector<std::exception_ptr> errors_;         // one per device
  std::vector<std::thread> threads_;               // last: joined first
};

// Sets libtorch's intra-op threads so `num_devices` replicas running at once
// do not oversubscribe the cores: max(1, hardware cores / num_devices), or
// `threads_per_device` when > 0. libtorch's thread count is process-wide (its
// own setting, not ours); returns the value set.
int configure_torch_threads(int num_devices, int threads_per_device = 0);

// [begin, end) of the slice of a batch of `batch_size` samples that device
// `device` of `num_devices` gets: sizes differ by at most one, the first
// devices get the larger ones. Throws InvalidArgument for a bad device.
std::pair<int64_t, int64_t> batch_slice(int64_t batch_size, int num_devices, int device);

}  // namespace pushpull::torch
