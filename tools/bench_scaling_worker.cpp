// SPDX-License-Identifier: Apache-2.0
// One worker of `pushpull bench scaling`: the simulated step of
// bench_scaling.h over pushpull's ring (a collective Session, Horovod's
// model: one named allreduce per layer, run by the background engine) or its
// parameter server (a dist_sync KVStore: one pushpull per layer key), or with
// no communication at all (the baseline). Started by the benchmark in its
// host namespace, configured by the environment it set.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "bench_scaling.h"
#include "pushpull/array.h"
#include "pushpull/collective.h"
#include "pushpull/error.h"
#include "pushpull/kvstore.h"
#include "pushpull/log.h"

namespace pushpull::cli {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::duration<double, std::milli>;

// The engine behind a step: submit(l) hands layer l's gradient over without
// waiting; finish() waits until every submitted layer's result is back.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual void submit(int layer) = 0;
  virtual void finish() = 0;
  virtual void barrier() = 0;
  // After the first step every element of every result is the number of workers.
  virtual void check(int workers) = 0;
};

void check_value(const Array& a, int workers, int layer) {
  const auto* p = static_cast<const float*>(a.data());
  const int64_t n = a.numel();
  for (int64_t i : {int64_t{0}, n / 2, n - 1})
    if (p[i] != static_cast<float>(workers))
      throw Internal(
          fmt::format("bench scaling: layer {} element {} is {} after the first step, "
                      "expected {} (the sum of every worker's 1)",
                      layer, i, p[i], workers));
}

class NoEngine : public Engine {
 public:
  void submit(int) override {}
  void finish() override {}
  void barrier() override {}
  void check(int) override {}
};

class RingEngine : public Engine {
 public:
  RingEngine(int layers, int64_t count) : session_(Options::from_env()) {
    for (int l = 0; l < layers; ++l) {
      grads_.push_back(Array::full(Shape{count}, 1.0));
      outs_.push_back(Array::zeros(Shape{count}, DType::kFloat32));
    }
  }
  void submit(int l) override {
    auto& c = session_.communicator();
    handles_.push_back(c.allreduce_async(fmt::format("layer{}", l),
                                         grads_[static_cast<size_t>(l)].view(),
                                         outs_[static_cast<size_t>(l)].view()));
  }
  void finish() override {
    for (auto& h : handles_)
      session_.communicator().wait(h);
    handles_.clear();
  }
  void barrier() override { session_.communicator().barrier(); }
  void check(int workers) override {
    for (size_t l = 0; l < outs_.size(); ++l)
      check_value(outs_[l], workers, static_cast<int>(l));
  }

 private:
  collective::Session session_;
  std::vector<Array> grads_, outs_;
  std::vector<collective::Handle> handles_;
};

class PsEngine : public Engine {
 public:
  PsEngine(int layers, int64_t count) : kv_(create_kvstore("dist_sync", Options::from_env())) {
    std::vector<Key> keys;
    std::vector<ArrayView> init;
    for (int l = 0; l < layers; ++l) {
      grads_.push_back(Array::full(Shape{count}, 1.0));
      outs_.push_back(Array::zeros(Shape{count}, DType::kFloat32));
      keys.emplace_back(l);
      init.push_back(outs_.back().view());
    }
    kv_->init(keys, init);
  }
  void submit(int l) override {
    handles_.push_back(kv_->pushpull_async({Key(l)}, {{grads_[static_cast<size_t>(l)].view()}},
                                           {{outs_[static_cast<size_t>(l)].view()}}));
  }
  void finish() override {
    for (auto& h : handles_)
      kv_->wait(h);
    handles_.clear();
  }
  void barrier() override { kv_->barrier(); }
  void check(int workers) override {
    for (size_t l = 0; l < outs_.size(); ++l)
      check_value(outs_[l], workers, static_cast<int>(l));
  }

 private:
  std::unique_ptr<KVStore> kv_;
  std::vector<Array> grads_, outs_;
  std::vector<KVHandle> handles_;
};

}  // namespace

int run_scaling_worker(const ScalingWorkerArgs& a) {
  set_log_level(Options::from_env().log_level);
  const StepSpec& s = a.step;
  const int64_t count = std::max<int64_t>(
      1, static_cast<int64_t>(s.grad_bytes / 4 / static_cast<uint64_t>(s.layers)));
  std::unique_ptr<Engine> engine;
  if (a.impl == "pushpull_ring")
    engine = std::make_unique<RingEngine>(s.layers, count);
  else if (a.impl == "pushpull_ps")
    engine = std::make_unique<PsEngine>(s.layers, count);
  else if (a.impl == "none")
    engine = std::make_unique<NoEngine>();
  else
    throw InvalidArgument(fmt::format("bench scaling worker: unknown impl '{}'", a.impl));

  const Ms forward(s.compute_ms / 3), share(s.compute_ms * 2 / 3 / s.layers);
  std::vector<double> step_ms;
  double wait_ms = 0;
  Clock::time_point timed_start;
  std::pair<uint64_t, uint64_t> cpu0;
  for (int it = 0; it < s.warmup + s.steps; ++it) {
    if (it == s.warmup) {
      engine->barrier();  // every worker starts the timed steps together
      timed_start = Clock::now();
      cpu0 = cpu_jiffies();
    }
    const auto t0 = Clock::now();
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(forward));
    for (int k = 1; k <= s.layers; ++k) {
      std::this_thread::sleep_until(
          t0 + std::chrono::duration_cast<Clock::duration>(forward + share * k));
      engine->submit(s.layers - k);  // the last layer's gradient is ready first
    }
    const auto backward_end = Clock::now();
    engine->finish();
    const auto t1 = Clock::now();
    if (it == 0) engine->check(a.workers);
    if (it >= s.warmup) {
      step_ms.push_back(Ms(t1 - t0).count());
      wait_ms += Ms(t1 - backward_end).count();
    }
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - timed_start).count();
  const auto cpu1 = cpu_jiffies();
  engine->barrier();  // nobody leaves (and fails the others' last ops) early
  {
    std::ofstream f(fmt::format("{}/result.{}.tmp", a.dir, a.rank));
    for (double ms : step_ms)
      f << ms << "\n";
    f << "elapsed " << elapsed << "\nwait " << wait_ms / std::max(1, s.steps) << "\n";
    // The machine's CPU use during the timed steps (every process, not only this job's).
    f << "cpu " << cpu1.first - cpu0.first << " " << cpu1.second - cpu0.second << "\n";
  }
  std::rename(fmt::format("{}/result.{}.tmp", a.dir, a.rank).c_str(),
              fmt::format("{}/result.{}", a.dir, a.rank).c_str());
  return 0;
}

std::vector<std::string> worker_argv(const std::string& impl, int rank, int workers,
                                     const std::string& dir, const StepSpec& step) {
  return {"bench",          "scaling",
          "--worker-impl",  impl,
          "--worker-rank",  std::to_string(rank),
          "--worker-count", std::to_string(workers),
          "--worker-dir",   dir,
          "--compute-ms",   fmt::format("{}", step.compute_ms),
          "--grad-bytes",   std::to_string(step.grad_bytes),
          "--layers",       std::to_string(step.layers),
          "--warmup",       std::to_string(step.warmup),
          "--steps",        std::to_string(step.steps)};
}

}  // namespace pushpull::cli
