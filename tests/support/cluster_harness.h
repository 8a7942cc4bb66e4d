// SPDX-License-Identifier: Apache-2.0
// InProcessCluster: a scheduler, S servers and N workers as threads of the
// test process, on loopback (or the in-process medium: Config::host) with
// short heartbeats. Construction returns when
// every node has started (ranks assigned, connections up); nodes are indexed
// by their assigned rank. The destructor stops everything (without the
// orderly leave unless shutdown() was called), so a failing test leaves no
// threads or sockets behind.
//
// Upper layers install their handlers with `setup` (called for every node
// before its start()).
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "cluster/node.h"
#include "cluster/scheduler.h"

namespace pushpull::test {

class InProcessCluster {
 public:
  struct Config {
    int servers = 2;
    int workers = 3;
    Millis heartbeat_interval{100};
    Millis heartbeat_timeout{2000};
    Millis startup_timeout{20000};
    std::string job_secret;
    // Where the nodes listen and meet: loopback TCP, or "inproc" for the
    // in-process medium (support/media.h).
    std::string host = "127.0.0.1";
    int socket_buffer_bytes = -1;  // NetOptions::socket_buffer_bytes (-1: automatic)
    std::function<void(cluster::Node&)> setup;
  };
  explicit InProcessCluster(Config config);
  ~InProcessCluster();

  cluster::Node& server(int rank) { return *servers_.at(static_cast<size_t>(rank)); }
  cluster::Node& worker(int rank) { return *workers_.at(static_cast<size_t>(rank)); }
  std::vector<cluster::Node*> nodes();
  // Options every node of this cluster uses (role unset).
  const Options& options() const { return options_; }
  int scheduler_port() const { return port_; }

  // Orderly shutdown of every node in parallel; returns the scheduler's result.
  Status shutdown();
  // Runs f(node) on every node at once (one thread each) and rethrows the first exception.
  void parallel(const std::function<void(cluster::Node&)>& f);

 private:
  Options options_;
  std::unique_ptr<cluster::Scheduler> scheduler_;
  std::future<Status> scheduler_result_;
  int port_ = 0;
  std::vector<std::unique_ptr<cluster::Node>> servers_, workers_;
};

}  // namespace pushpull::test
