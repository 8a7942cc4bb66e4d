// SPDX-License-Identifier: Apache-2.0
// create_kvstore: one line per type name. The distributed types add their own
// lines here (dist_sync, dist_async, dist_device_sync, dist_sync_allreduce).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>

#include "cluster/scheduler.h"
#include "kvstore/allreduce_store.h"
#include "kvstore/dist_store.h"
#include "kvstore/local_store.h"
#include "ps/server.h"
#include "pushpull/error.h"
#include "pushpull/kvstore.h"
#include "pushpull/log.h"

namespace pushpull {
namespace {

using Maker = std::unique_ptr<KVStore> (*)(std::string_view type, const Options& options);

std::unique_ptr<KVStore> make_local(std::string_view type, const Options& options) {
  return std::make_unique<LocalStore>(std::string(type), options);
}

// MXNet style: one program is launched for every role, and a server or
// scheduler process becomes that role here, serves until the job ends, and
// exits (0, or 1 when the job failed): create_kvstore does not return there.
[[noreturn]] void serve_role_and_exit(const Options& options) {
  int code = 0;
  try {
    if (options.cluster.role == Role::kServer) {
      ps::run_server(options);
    } else {
      cluster::Scheduler scheduler(options);
      scheduler.bind();
      Status result = scheduler.run();
      if (!result.is_ok()) {
        PP_ERROR("job failed: {}", result.to_string());
        code = 1;
      }
    }
  } catch (const std::exception& e) {
    PP_ERROR("{} failed: {}", role_name(options.cluster.role), e.what());
    code = 1;
  }
  std::exit(code);
}

std::unique_ptr<KVStore> make_dist(std::string_view type, const Options& options) {
  if (options.cluster.role == Role::kServer || options.cluster.role == Role::kScheduler)
    serve_role_and_exit(options);
  if (options.cluster.role == Role::kNone)
    throw InvalidArgument(fmt::format(
        "'{}' is a distributed store and this process is not part of a job (DMLC_ROLE is not "
        "set); start it with `pushpull launch -n WORKERS -s SERVERS PROGRAM`",
        type));
  return std::make_unique<DistStore>(std::string(type), options);
}

// No servers needed; in a job that has some (MXNet-style launch of one
// program for every role) the server and scheduler processes serve and exit.
std::unique_ptr<KVStore> make_allreduce(std::string_view type, const Options& options) {
  if (options.cluster.role == Role::kServer || options.cluster.role == Role::kScheduler)
    serve_role_and_exit(options);
  // An elastic worker's group is the default session, re-formed by
  // elastic::run_default: the store follows it (elastic_track_store).
  if (collective::elastic::is_elastic_worker(options)) {
    if (!collective::is_initialized()) collective::init(options);
    return std::make_unique<AllreduceStore>(
        std::string(type), options,
        []() -> collective::Communicator& { return collective::default_session().communicator(); });
  }
  return std::make_unique<AllreduceStore>(std::string(type), options);
}

struct TypeEntry {
  std::string_view name;
  Maker make;
};

// Arrays live on the CPU today, so "device" (sum on the arrays' device) and
// its alias run the same code as "local".
constexpr TypeEntry kTypes[] = {
    {"local", make_local},
    {"local_update_cpu", make_local},
    {"local_allreduce_cpu", make_local},
    {"device", make_local},
    {"local_allreduce_device", make_local},
    {"dist_sync", make_dist},
    {"dist_device_sync", make_dist},
    {"dist_sync_device", make_dist},
    {"dist_async", make_dist},
    {"dist_async_device", make_dist},
    {"dist_sync_allreduce", make_allreduce},
    {"allreduce", make_allreduce},
};

}  // namespace

std::vector<std::string> kvstore_types() {
  std::vector<std::string> names;
  for (const auto& t : kTypes)
    names.emplace_back(t.name);
  return names;
}

std::unique_ptr<KVStore> create_kvstore(std::string_view type, const Options& options) {
  for (const auto& t : kTypes)
    if (t.name == type) return t.make(type, options);
  throw InvalidArgument(
      fmt::format("unknown kvstore type '{}'; valid: {}", type, fmt::join(kvstore_types(), ", ")));
}

}  // namespace pushpull
