// SPDX-License-Identifier: Apache-2.0
#include "support/cluster_harness.h"

#include <exception>

namespace pushpull::test {

InProcessCluster::InProcessCluster(Config config) {
  options_.net.node_host = config.host;
  options_.net.connect_timeout = Millis{10000};
  options_.net.job_secret = config.job_secret;
  options_.cluster.root_uri = config.host;
  options_.cluster.root_port = 0;
  options_.cluster.num_servers = config.servers;
  options_.cluster.num_workers = config.workers;
  options_.cluster.heartbeat_interval = config.heartbeat_interval;
  options_.cluster.heartbeat_timeout = config.heartbeat_timeout;
  options_.net.socket_buffer_bytes = config.socket_buffer_bytes;
  options_.cluster.startup_timeout = config.startup_timeout;
  options_.cluster.barrier_timeout = Millis{30000};
  options_.cluster.worker_mesh = true;  // the tests also send worker to worker
  scheduler_ = std::make_unique<cluster::Scheduler>(options_);
  port_ = scheduler_->bind();
  options_.cluster.root_port = port_;
  scheduler_result_ = std::async(std::launch::async, [this] { return scheduler_->run(); });

  std::vector<std::unique_ptr<cluster::Node>> all;
  for (int i = 0; i < config.servers + config.workers; ++i) {
    Options o = options_;
    o.cluster.role = i < config.servers ? Role::kServer : Role::kWorker;
    all.push_back(std::make_unique<cluster::Node>(o));
    if (config.setup) config.setup(*all.back());
  }
  std::vector<std::future<void>> started;
  for (auto& n : all)
    started.push_back(std::async(std::launch::async, [&n] { n->start(); }));
  std::exception_ptr error;
  for (auto& f : started) {
    try {
      f.get();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) {
    scheduler_->stop();
    std::rethrow_exception(error);
  }
  servers_.resize(static_cast<size_t>(config.servers));
  workers_.resize(static_cast<size_t>(config.workers));
  for (auto& n : all) {
    auto& list = n->role() == Role::kServer ? servers_ : workers_;
    list.at(static_cast<size_t>(n->rank())) = std::move(n);
  }
}

InProcessCluster::~InProcessCluster() {
  workers_.clear();
  servers_.clear();
  if (scheduler_) scheduler_->stop();
  if (scheduler_result_.valid()) scheduler_result_.wait();
}

std::vector<cluster::Node*> InProcessCluster::nodes() {
  std::vector<cluster::Node*> out;
  for (auto& n : servers_)
    out.push_back(n.get());
  for (auto& n : workers_)
    out.push_back(n.get());
  return out;
}

void InProcessCluster::parallel(const std::function<void(cluster::Node&)>& f) {
  std::vector<std::future<void>> fs;
  for (auto* n : nodes())
    fs.push_back(std::async(std::launch::async, [&f, n] { f(*n); }));
  std::exception_ptr error;
  for (auto& x : fs) {
    try {
      x.get();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

Status InProcessCluster::shutdown() {
  parallel([](cluster::Node& n) { n.shutdown(); });
  return scheduler_result_.get();
}

}  // namespace pushpull::test
