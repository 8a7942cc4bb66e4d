// SPDX-License-Identifier: Apache-2.0
#include "kvstore/inprocess_job.h"

#include <future>
#include <vector>

#include "cluster/scheduler.h"
#include "kvstore/dist_store.h"
#include "ps/server.h"
#include "transport/inproc/in_process_listeners.h"

namespace pushpull {

void run_inprocess_job(const InProcessJob& job, const std::function<void(KVStore&)>& body) {
  Options base = job.options;
  base.cluster.num_servers = job.servers;
  base.cluster.num_workers = job.workers;
  // Loopback TCP, or the in-process medium when asked for (no port at all).
  const std::string host = transport::is_in_process_host(job.options.cluster.root_uri)
                               ? job.options.cluster.root_uri
                               : std::string("127.0.0.1");
  base.cluster.root_uri = host;
  base.cluster.root_port = 0;
  base.net.node_host = host;
  base.net.port = 0;

  Options so = base;
  so.cluster.role = Role::kScheduler;
  cluster::Scheduler scheduler(so);
  base.cluster.root_port = scheduler.bind();
  auto result = std::async(std::launch::async, [&] { return scheduler.run(); });

  std::vector<std::future<void>> nodes;
  for (int s = 0; s < job.servers; ++s) {
    Options o = base;
    o.cluster.role = Role::kServer;
    if (job.node_options) job.node_options(Role::kServer, s, o);
    nodes.push_back(std::async(std::launch::async, [o] { ps::run_server(o); }));
  }
  for (int w = 0; w < job.workers; ++w) {
    Options o = base;
    o.cluster.role = Role::kWorker;
    if (job.node_options) job.node_options(Role::kWorker, w, o);
    nodes.push_back(std::async(std::launch::async, [o, &job, &body] {
      DistStore store(job.type, o);
      body(store);
    }));
  }
  std::exception_ptr first;
  for (auto& n : nodes) {
    try {
      n.get();
    } catch (...) {
      if (!first) first = std::current_exception();
      scheduler.stop();
    }
  }
  Status st = result.get();
  if (first) std::rethrow_exception(first);
  st.raise();
}

}  // namespace pushpull
