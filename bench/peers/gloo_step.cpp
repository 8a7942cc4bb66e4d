// SPDX-License-Identifier: Apache-2.0
// Peer driver of `pushpull bench scaling`: the simulated data-parallel step of
// tools/bench_scaling.h over Gloo's ring allreduce (TCP transport), as a
// Horovod-style program would drive Gloo: the main thread sleeps through the
// forward and the backward's layer shares and hands each layer's gradient to
// a communication thread as its share ends; that thread allreduces the layers
// in the order they came (the same order on every rank), so communication
// overlaps the rest of the backward. Started once per rank by the benchmark:
//   pp_gloo_step RANK SIZE DIR HOST COMPUTE_MS GRAD_BYTES LAYERS WARMUP STEPS
// Rendezvous through a FileStore in DIR; writes DIR/result.RANK in the format
// the benchmark reads (one line per timed step in ms, "elapsed S", "wait MS", "cpu BUSY TOTAL").
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::duration<double, std::milli>;

void sum(void* a, const void* b, const void* c, size_t n) {
  auto* out = static_cast<float*>(a);
  auto* x = static_cast<const float*>(b);
  auto* y = static_cast<const float*>(c);
  for (size_t i = 0; i < n; ++i)
    out[i] = x[i] + y[i];
}

// Layers handed over by the main thread, allreduced one at a time.
class CommThread {
 public:
  CommThread(std::shared_ptr<gloo::Context> ctx, std::vector<std::vector<float>>* grads)
      : ctx_(std::move(ctx)), grads_(grads), thread_([this] { loop(); }) {}
  ~CommThread() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(int layer) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(layer);
      ++submitted_;
    }
    cv_.notify_all();
  }
  // Waits until every submitted layer is reduced; rethrows the thread's error.
  void finish() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::minutes(10), [&] { return done_ == submitted_ || error_; });
    if (error_) std::rethrow_exception(error_);
    if (done_ != submitted_) throw std::runtime_error("allreduce did not finish in 10 minutes");
  }

 private:
  void loop() {
    while (true) {
      int layer = 0;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        layer = queue_.front();
        queue_.pop_front();
      }
      try {
        auto& g = (*grads_)[static_cast<size_t>(layer)];
        gloo::AllreduceOptions o(ctx_);
        o.setOutput(g.data(), g.size());
        o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        o.setReduceFunction(sum);
        o.setTag(++tag_);
        gloo::allreduce(o);
      } catch (...) {
        std::lock_guard lock(mu_);
        error_ = std::current_exception();
        cv_.notify_all();
        return;
      }
      std::lock_guard lock(mu_);
      ++done_;
      cv_.notify_all();
    }
  }

  std::shared_ptr<gloo::Context> ctx_;
  std::vector<std::vector<float>>* grads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  long submitted_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  uint32_t tag_ = 1000;
  std::thread thread_;
};

// Machine-wide (busy, total) jiffies from /proc/stat, as the benchmark's own workers record them.
std::pair<unsigned long long, unsigned long long> cpu_jiffies() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  unsigned long long v[8] = {}, total = 0;
  f >> cpu;
  for (auto& x : v) {
    f >> x;
    total += x;
  }
  return {total - v[3] - v[4], total};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr, "usage: %s RANK SIZE DIR HOST COMPUTE_MS GRAD_BYTES LAYERS WARMUP STEPS\n",
                 argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]);
  const std::string dir = argv[3], host = argv[4];
  const double compute_ms = std::atof(argv[5]);
  const unsigned long long grad_bytes = std::strtoull(argv[6], nullptr, 10);
  const int layers = std::atoi(argv[7]), warmup = std::atoi(argv[8]), steps = std::atoi(argv[9]);
  if (size < 1 || rank < 0 || rank >= size || layers < 1 || steps < 1 || warmup < 0) {
    std::fprintf(stderr, "gloo_step: bad arguments\n");
    return 2;
  }
  try {
    gloo::rendezvous::FileStore store(dir);
    gloo::transport::tcp::attr attr(host.c_str());
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(std::chrono::seconds(120));
    ctx->connectFullMesh(store, dev);
    const size_t count = std::max<unsigned long long>(1, grad_bytes / 4 / layers);
    std::vector<std::vector<float>> grads(static_cast<size_t>(layers), std::vector<float>(count));
    uint32_t tag = 0;
    auto barrier = [&] {
      gloo::BarrierOptions b(ctx);
      b.setTag(++tag);
      gloo::barrier(b);
    };
    std::vector<double> step_ms;
    double wait_ms = 0;
    Clock::time_point timed_start;
    std::pair<unsigned long long, unsigned long long> cpu0;
    {
      CommThread comm(ctx, &grads);
      const Ms forward(compute_ms / 3), share(compute_ms * 2 / 3 / layers);
      for (int it = 0; it < warmup + steps; ++it) {
        if (it == warmup) {
          barrier();  // on the main thread while the comm thread is idle
          timed_start = Clock::now();
          cpu0 = cpu_jiffies();
        }
        for (auto& g : grads)  // in-place allreduce: a fresh gradient of ones every step
          std::fill(g.begin(), g.end(), 1.0f);
        const auto t0 = Clock::now();
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(forward));
        for (int k = 1; k <= layers; ++k) {
          std::this_thread::sleep_until(
              t0 + std::chrono::duration_cast<Clock::duration>(forward + share * k));
          comm.submit(layers - k);
        }
        const auto backward_end = Clock::now();
        comm.finish();
        const auto t1 = Clock::now();
        if (it == 0 && grads[0][0] != static_cast<float>(size)) {
          std::fprintf(stderr, "gloo_step: sum is %f, expected %d\n", grads[0][0], size);
          return 1;
        }
        if (it >= warmup) {
          step_ms.push_back(Ms(t1 - t0).count());
          wait_ms += Ms(t1 - backward_end).count();
        }
      }
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - timed_start).count();
    const auto cpu1 = cpu_jiffies();
    barrier();
    {
      std::ofstream f(dir + "/result." + std::to_string(rank) + ".tmp");
      for (double ms : step_ms)
        f << ms << "\n";
      f << "elapsed " << elapsed << "\nwait " << wait_ms / steps << "\n";
      f << "cpu " << cpu1.first - cpu0.first << " " << cpu1.second - cpu0.second << "\n";
    }
    std::rename((dir + "/result." + std::to_string(rank) + ".tmp").c_str(),
                (dir + "/result." + std::to_string(rank)).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_step rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
