// SPDX-License-Identifier: Apache-2.0
// Runs a test body on every worker of a store of any type, in this process:
//   local, device                 one store, one "worker"
//   dist_sync, dist_async         a parameter-server job (scheduler, servers
//                                 and workers as threads on loopback)
//   dist_sync_allreduce           workers as threads over the in-process
//                                 collective transport
// so the conformance and compression tests hold every type to one set of
// expectations. The first exception of any worker is rethrown (after the job
// ended: the others fail fast, never wait for it).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "collective/harness.h"
#include "kvstore/allreduce_store.h"
#include "kvstore/inprocess_job.h"
#include "pushpull/kvstore.h"
#include "transport/inproc/inprocess_transport.h"

namespace pushpull::testing {

struct JobShape {
  int workers = 2;
  int servers = 2;                // parameter-server types only
  int64_t bigarray_bound = 1000;  // small: keys of 1000+ values split over the servers
};

inline bool is_dist_ps(const std::string& type) {
  return type.rfind("dist_", 0) == 0 && type.find("allreduce") == std::string::npos;
}
inline bool is_local_type(const std::string& type) {
  return type == "local" || type == "device";
}

inline Options job_options() {
  Options o;
  o.cluster.heartbeat_interval = Millis(200);
  o.cluster.heartbeat_timeout = Millis(5000);
  o.cluster.startup_timeout = Millis(30000);
  o.kvstore.server_threads = 2;
  o.kvstore.engine_threads = 2;
  o.kvstore.wait_timeout = Millis(30000);
  // Optimizer-state files' key: the tests' secret file (PUSHPULL_SECRET_FILE
  // from ctest), not the home of whoever runs them.
  o.kvstore.file_key_env = Environment::current();
  return o;
}

// Workers of a local type: one.
inline int workers_of(const std::string& type, const JobShape& shape) {
  return is_local_type(type) ? 1 : shape.workers;
}

inline void run_store_job(const std::string& type, const JobShape& shape,
                          const std::function<void(KVStore&)>& body) {
  Options o = job_options();
  o.kvstore.bigarray_bound = shape.bigarray_bound;
  if (is_local_type(type)) {
    auto kv = create_kvstore(type, o);
    body(*kv);
    return;
  }
  if (is_dist_ps(type)) {
    run_inprocess_job(InProcessJob{shape.servers, shape.workers, type, o}, body);
    return;
  }
  transport::InProcessFabric fabric(shape.workers);
  collective::CommunicatorOptions c;
  c.peer_timeout = Millis(5000);
  c.wait_timeout = Millis(30000);
  c.collective.cycle_time_ms = 0.5;
  collective::testing::on_threads(shape.workers, [&](int r) {
    auto comm = std::make_unique<collective::Communicator>(fabric.endpoint(r), c);
    AllreduceStore store(type, o, std::move(comm));
    body(store);
  });
}

}  // namespace pushpull::testing
