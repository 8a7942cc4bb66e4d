// SPDX-License-Identifier: Apache-2.0
// Runs a test body on every worker of a store of any type, in this process:
//   local, device                 one store, one "worker"
//   dist_sync, dist_async         a parameter-server job (scheduler, servers
//                                 and workers as threads on loopback)
//   dist_sync_allreduce           workers as threads over the in-process
//                                 collective transport
// so the conformance and compression tests hold every type to one set of
// expectations. A type may name the transport under its job,
// "<type>@<transport>" (transports_of lists them):
//   dist_sync, dist_async         payloads in same-host shared-memory rings
//                                 (the default on one host); "@tcp": in the
//                                 TCP frames (NetOptions::ps_shared_memory off);
//                                 "@inproc": every connection on the
//                                 in-process medium (socketpairs, no port;
//                                 shared memory off)
//   dist_sync_allreduce           in-process (the default); "@tcp": a TCP
//                                 mesh on loopback with its direct streams;
//                                 "@shm": shared memory (ShmTransport) The first exception of any
//                                 worker is rethrown (after the job
// ended: the others fail fast, never wait for it).
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective/fabrics.h"
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

// "dist_sync@tcp" -> "dist_sync" and "tcp"; no "@": the default transport ("").
inline std::string store_of(const std::string& type) {
  return type.substr(0, type.find('@'));
}
inline std::string transport_of(const std::string& type) {
  auto at = type.find('@');
  return at == std::string::npos ? "" : type.substr(at + 1);
}

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
  const std::string store = store_of(type), over = transport_of(type);
  Options o = job_options();
  o.kvstore.bigarray_bound = shape.bigarray_bound;
  if (is_local_type(store)) {
    auto kv = create_kvstore(store, o);
    body(*kv);
    return;
  }
  if (is_dist_ps(store)) {
    if (over != "" && over != "tcp" && over != "inproc")
      throw std::invalid_argument("no such PS transport: " + type);
    o.net.ps_shared_memory = over == "";
    if (over == "inproc") o.cluster.root_uri = "inproc";
    run_inprocess_job(InProcessJob{shape.servers, shape.workers, store, o}, body);
    return;
  }
  using collective::testing::Kind;
  if (over != "" && over != "tcp" && over != "shm")
    throw std::invalid_argument("no such collective transport: " + type);
  auto group = collective::testing::connect_group(over == "tcp"   ? Kind::kTcp
                                                  : over == "shm" ? Kind::kShm
                                                                  : Kind::kInProcess,
                                                  shape.workers);
  collective::CommunicatorOptions c;
  c.peer_timeout = Millis(5000);
  c.wait_timeout = Millis(30000);
  c.collective.cycle_time_ms = 0.5;
  collective::testing::on_threads(shape.workers, [&](int r) {
    auto comm =
        std::make_unique<collective::Communicator>(std::move(group[static_cast<size_t>(r)]), c);
    AllreduceStore store(store_of(type), o, std::move(comm));
    body(store);
  });
}

}  // namespace pushpull::testing
