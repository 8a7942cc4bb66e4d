// SPDX-License-Identifier: Apache-2.0
#include "pushpull/torch/replicas.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <string>

#include "pushpull/error.h"

namespace pushpull::torch {

ReplicaRunner::ReplicaRunner(int num_devices) : num_devices_(num_devices) {
  if (num_devices < 1) {
    throw InvalidArgument("ReplicaRunner: num_devices is " + std::to_string(num_devices) +
                          "; give at least 1 device per worker");
  }
  errors_.resize(static_cast<size_t>(num_devices));
  threads_.reserve(static_cast<size_t>(num_devices - 1));
  for (int d = 1; d < num_devices; ++d)
    threads_.emplace_back([this, d] { loop(d); });
}

ReplicaRunner::~ReplicaRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    t.join();
}

void ReplicaRunner::loop(int device) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    try {
      (*job)(device);
    } catch (...) {
      errors_[static_cast<size_t>(device)] = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_;
    }
    cv_.notify_all();
  }
}

void ReplicaRunner::run(const std::function<void(int)>& fn) {
  std::fill(errors_.begin(), errors_.end(), nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    pending_ = num_devices_ - 1;
    ++generation_;
  }
  cv_.notify_all();
  try {
    fn(0);
  } catch (...) {
    errors_[0] = std::current_exception();
  }
  {
    // Local compute only (see the header): the other devices always finish.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }
  for (auto& e : errors_) {
    if (e) std::rethrow_exception(e);
  }
}

int configure_torch_threads(int num_devices, int threads_per_device) {
  int n = threads_per_device;
  if (n <= 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    n = std::max(1, cores / std::max(1, num_devices));
  }
  at::set_num_threads(n);
  return n;
}

std::pair<int64_t, int64_t> batch_slice(int64_t batch_size, int num_devices, int device) {
  if (num_devices < 1 || device < 0 || device >= num_devices || batch_size < 0) {
    throw InvalidArgument("batch_slice: device " + std::to_string(device) + " of " +
                          std::to_string(num_devices) + " for a batch of " +
                          std::to_string(batch_size) + " is out of range");
  }
  const int64_t base = batch_size / num_devices;
  const int64_t extra = batch_size % num_devices;
  const int64_t begin = device * base + std::min<int64_t>(device, extra);
  const int64_t len = base + (device < extra ? 1 : 0);
  return {begin, begin + len};
}

}  // namespace pushpull::torch
