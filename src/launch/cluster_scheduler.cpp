// SPDX-License-Identifier: Apache-2.0
#include "launch/cluster_scheduler.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "cluster/scheduler.h"
#include "pushpull/log.h"

namespace pushpull::launch {
namespace {

class ClusterScheduler final : public EmbeddedScheduler {
 public:
  explicit ClusterScheduler(Options o) : options_(std::move(o)) {}
  ~ClusterScheduler() override { stop(); }

  int start(const std::string& advertised, const std::string& bind_addr, int port) override {
    options_.cluster.root_uri = advertised;
    options_.cluster.root_port = port;
    options_.net.port = port;
    scheduler_ = std::make_unique<cluster::Scheduler>(options_);
    scheduler_->allow_worker_restarts(worker_restarts_);
    int bound = scheduler_->bind(bind_addr);
    thread_ = std::thread([this] {
      ScopedLogContext log("scheduler");
      Status st = scheduler_->run();
      std::lock_guard lock(mu_);
      result_ = std::move(st);
      cv_.notify_all();
    });
    return bound;
  }

  std::optional<Status> status() override {
    std::lock_guard lock(mu_);
    return result_;
  }

  bool wait(Millis deadline) override {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, deadline, [&] { return result_.has_value(); });
  }

  void stop() noexcept override {
    bool finished;
    {
      std::lock_guard lock(mu_);
      finished = result_.has_value();
    }
    // Stopping a scheduler that already finished would report a failure.
    if (scheduler_ && !finished) scheduler_->stop();
    if (thread_.joinable()) thread_.join();
  }

  void process_exited(Role role, int rank, int exit_code, int signal) noexcept override {
    if (!scheduler_) return;
    try {
      scheduler_->process_exited(role, rank, exit_code, signal);
    } catch (const std::exception& e) {
      PP_WARN("the scheduler could not take {} {}'s exit: {}", role_name(role), rank, e.what());
    }
  }

  bool failed_over(Role role, int rank) noexcept override {
    return scheduler_ && scheduler_->failed_over(role, rank);
  }

  void allow_worker_restarts(bool on) noexcept override { worker_restarts_ = on; }

  void process_restarting(Role role, int rank, int exit_code, int signal) noexcept override {
    if (!scheduler_) return;
    try {
      scheduler_->process_restarting(role, rank, exit_code, signal);
    } catch (const std::exception& e) {
      PP_WARN("the scheduler could not take {} {}'s restart: {}", role_name(role), rank, e.what());
    }
  }

  int worker_losses(int rank) noexcept override {
    return scheduler_ ? scheduler_->worker_losses(rank) : 0;
  }

  bool job_failed() noexcept override { return scheduler_ && !scheduler_->failure().is_ok(); }
  int server_losses(int rank) noexcept override {
    return scheduler_ ? scheduler_->server_losses(rank) : 0;
  }

 private:
  Options options_;
  bool worker_restarts_ = false;
  std::unique_ptr<cluster::Scheduler> scheduler_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Status> result_;
};

}  // namespace

SchedulerFactory cluster_scheduler_factory() {
  return [](const Options& o) -> std::unique_ptr<EmbeddedScheduler> {
    return std::make_unique<ClusterScheduler>(o);
  };
}

}  // namespace pushpull::launch
