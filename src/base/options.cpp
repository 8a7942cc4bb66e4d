// SPDX-License-Identifier: Apache-2.0
#include "pushpull/options.h"

#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "base/secret_file.h"
#include "pushpull/error.h"

extern char** environ;

namespace pushpull {

Environment Environment::current() {
  std::map<std::string, std::string> vars;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    vars.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return Environment(std::move(vars));
}

std::optional<std::string> Environment::get(std::string_view name) const {
  auto it = vars_.find(std::string(name));
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Environment::first(std::initializer_list<std::string_view> names) const {
  for (auto n : names)
    if (auto v = get(n)) return v;
  return std::nullopt;
}

std::string_view role_name(Role r) {
  switch (r) {
    case Role::kNone:
      return "none";
    case Role::kScheduler:
      return "scheduler";
    case Role::kServer:
      return "server";
    case Role::kWorker:
      return "worker";
  }
  return "invalid";
}

std::optional<Role> parse_role(std::string_view t) {
  if (t == "scheduler") return Role::kScheduler;
  if (t == "server") return Role::kServer;
  if (t == "worker") return Role::kWorker;
  if (t == "none" || t.empty()) return Role::kNone;
  return std::nullopt;
}

namespace {

// Reads the first set variable of `names` (PUSHPULL_* listed first) into `out`.
class Reader {
 public:
  explicit Reader(const Environment& env) : env_(env) {}

  template <typename Int>
  void integer(std::initializer_list<std::string_view> names, Int* out) {
    auto [name, value] = find(names);
    if (!value) return;
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(value->c_str(), &end, 10);
    if (errno || end == value->c_str() || *end != '\0')
      throw InvalidArgument(
          fmt::format("environment variable {}='{}' is not an integer", name, *value));
    *out = static_cast<Int>(v);
  }
  void real(std::initializer_list<std::string_view> names, double* out) {
    auto [name, value] = find(names);
    if (!value) return;
    char* end = nullptr;
    double v = std::strtod(value->c_str(), &end);
    if (end == value->c_str() || *end != '\0')
      throw InvalidArgument(
          fmt::format("environment variable {}='{}' is not a number", name, *value));
    *out = v;
  }
  void millis(std::initializer_list<std::string_view> names, Millis* out) {
    int64_t ms = -1;
    integer(names, &ms);
    if (ms >= 0) *out = Millis(ms);
  }
  // "1"/"true"/"yes"/"on" or "0"/"false"/"no"/"off".
  void flag(std::initializer_list<std::string_view> names, bool* out) {
    auto [name, value] = find(names);
    if (!value) return;
    if (*value == "1" || *value == "true" || *value == "yes" || *value == "on")
      *out = true;
    else if (*value == "0" || *value == "false" || *value == "no" || *value == "off" ||
             value->empty())
      *out = false;
    else
      throw InvalidArgument(
          fmt::format("environment variable {}='{}' is not a flag (use 1 or 0)", name, *value));
  }
  void string(std::initializer_list<std::string_view> names, std::string* out) {
    if (auto v = find(names).second) *out = *v;
  }
  std::pair<std::string_view, std::optional<std::string>> find(
      std::initializer_list<std::string_view> names) {
    for (auto n : names)
      if (auto v = env_.get(n)) return {n, v};
    return {"", std::nullopt};
  }

 private:
  const Environment& env_;
};

// The job secret (docs/security.md, "The job secret"): PUSHPULL_JOB_SECRET,
// else PUSHPULL_JOB_SECRET_FILE, else none with PUSHPULL_ALLOW_INSECURE=1,
// else the per-user secret file. An empty PUSHPULL_JOB_SECRET is unset:
// PUSHPULL_ALLOW_INSECURE=1 is the only way to run without a secret.
void resolve_job_secret(const Environment& env, NetOptions* n) {
  if (auto v = env.get("PUSHPULL_JOB_SECRET"); v && !v->empty()) {
    n->job_secret = *v;
    n->job_secret_source = "PUSHPULL_JOB_SECRET";
    return;
  }
  if (auto f = env.get("PUSHPULL_JOB_SECRET_FILE"); f && !f->empty()) {
    n->job_secret = base::read_secret_file(*f);
    n->job_secret_source = "PUSHPULL_JOB_SECRET_FILE=" + *f;
    return;
  }
  n->job_secret.clear();
  n->job_secret_source.clear();
  if (n->allow_insecure) return;
  base::UserSecret s = base::user_secret(env);
  n->job_secret = std::move(s.secret);
  n->job_secret_source = "the per-user secret file " + s.path;
}

}  // namespace

Options Options::from_env(const Environment& env) {
  Options o;
  Reader r(env);
  if (auto [name, v] = r.find({"PUSHPULL_LOG_LEVEL"}); v) {
    if (!parse_log_level(*v, &o.log_level))
      throw InvalidArgument(fmt::format(
          "{}='{}' is not a log level (use error, warning, info, debug or trace)", name, *v));
    set_log_level(o.log_level);
  }

  NetOptions& n = o.net;
  r.string({"PUSHPULL_NODE_HOST", "DMLC_NODE_HOST"}, &n.node_host);
  r.string({"PUSHPULL_INTERFACE", "DMLC_INTERFACE"}, &n.interface);
  r.integer({"PUSHPULL_PORT", "DMLC_PORT"}, &n.port);
  r.integer({"PUSHPULL_MAX_MESSAGE_BYTES"}, &n.max_message_bytes);
  r.integer({"PUSHPULL_SOCKET_BUFFER_BYTES"}, &n.socket_buffer_bytes);
  r.millis({"PUSHPULL_CONNECT_TIMEOUT_MS"}, &n.connect_timeout);
  r.string({"PUSHPULL_JOB_ID"}, &n.job_id);
  r.flag({"PUSHPULL_ALLOW_INSECURE"}, &n.allow_insecure);
  r.flag({"PUSHPULL_BIND_ANY"}, &n.bind_any);
  r.flag({"PUSHPULL_TLS"}, &n.tls);
  r.string({"PUSHPULL_LISTEN_FD"}, &n.inherited_listener);
  r.flag({"PUSHPULL_PS_SHM"}, &n.ps_shared_memory);
  r.flag({"PUSHPULL_PS_LEND"}, &n.ps_lend);
  r.millis({"PUSHPULL_HANDSHAKE_TIMEOUT_MS"}, &n.handshake_timeout);

  ClusterOptions& c = o.cluster;
  if (auto [name, v] = r.find({"PUSHPULL_ROLE", "DMLC_ROLE"}); v) {
    auto role = parse_role(*v);
    if (!role)
      throw InvalidArgument(
          fmt::format("{}='{}' is not a role (use scheduler, server or worker)", name, *v));
    c.role = *role;
  }
  r.string({"PUSHPULL_ROOT_URI", "DMLC_PS_ROOT_URI"}, &c.root_uri);
  r.integer({"PUSHPULL_ROOT_PORT", "DMLC_PS_ROOT_PORT"}, &c.root_port);
  r.integer({"PUSHPULL_NUM_SERVER", "DMLC_NUM_SERVER"}, &c.num_servers);
  r.integer({"PUSHPULL_NUM_WORKER", "DMLC_NUM_WORKER"}, &c.num_workers);
  r.millis({"PUSHPULL_HEARTBEAT_INTERVAL_MS"}, &c.heartbeat_interval);
  double timeout_s = -1;
  r.real({"PUSHPULL_TIMEOUT"}, &timeout_s);
  if (timeout_s > 0) {
    c.heartbeat_timeout = Millis(static_cast<int64_t>(timeout_s * 1000));
    c.startup_timeout = c.heartbeat_timeout;
  }
  r.millis({"PUSHPULL_HEARTBEAT_TIMEOUT_MS"}, &c.heartbeat_timeout);
  r.millis({"PUSHPULL_STARTUP_TIMEOUT_MS"}, &c.startup_timeout);
  r.millis({"PUSHPULL_BARRIER_TIMEOUT_MS"}, &c.barrier_timeout);
  r.integer({"PUSHPULL_RANK"}, &c.preferred_rank);
  r.integer({"PUSHPULL_PS_REPLICAS"}, &c.ps_replicas);
  r.flag({"PUSHPULL_TEST_STOP_WHILE_CATCHING_UP"}, &c.test_stop_while_catching_up);

  KVStoreOptions& k = o.kvstore;
  r.integer({"PUSHPULL_BIGARRAY_BOUND", "MXNET_KVSTORE_BIGARRAY_BOUND"}, &k.bigarray_bound);
  r.integer({"PUSHPULL_PS_CHUNK_BYTES"}, &k.chunk_bytes);
  r.integer({"PUSHPULL_SERVER_THREADS"}, &k.server_threads);
  r.integer({"PUSHPULL_KVSTORE_THREADS"}, &k.engine_threads);
  r.millis({"PUSHPULL_KVSTORE_WAIT_TIMEOUT_MS"}, &k.wait_timeout);
  for (std::string_view name :
       {"PUSHPULL_CHECKPOINT_KEY_FILE", "PUSHPULL_CHECKPOINT_KEY_ID", "PUSHPULL_SECRET_FILE",
        "XDG_CONFIG_HOME", "HOME", "PUSHPULL_ALLOW_INSECURE"})
    if (auto v = env.get(name)) k.file_key_env.set(std::string(name), *v);
  r.integer({"PUSHPULL_PS_BACKUP_WORKERS"}, &k.ps_backup_workers);
  r.integer({"PUSHPULL_PS_BACKUP_MAX_LATE"}, &k.ps_backup_max_late);
  r.string({"PUSHPULL_PS_SERVER_WEIGHTS"}, &k.ps_server_weights);
  r.string({"PUSHPULL_CHECKPOINT_DIR"}, &k.checkpoint_dir);
  r.integer({"PUSHPULL_CHECKPOINT_EVERY"}, &k.checkpoint_every);
  r.string({"PUSHPULL_RESUME_DIR"}, &k.resume_dir);
  r.integer({"PUSHPULL_RESUME_ROUND"}, &k.resume_round);

  CollectiveOptions& col = o.collective;
  r.integer({"PUSHPULL_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"},
            &col.rank);
  r.integer(
      {"PUSHPULL_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"},
      &col.size);
  r.integer({"PUSHPULL_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"},
            &col.local_rank);
  r.integer({"PUSHPULL_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
             "SLURM_NTASKS_PER_NODE"},
            &col.local_size);
  r.string({"PUSHPULL_MASTER_ADDR", "MASTER_ADDR"}, &col.master_addr);
  r.integer({"PUSHPULL_MASTER_PORT", "MASTER_PORT"}, &col.master_port);
  r.integer({"PUSHPULL_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"}, &col.fusion_threshold_bytes);
  r.real({"PUSHPULL_CYCLE_TIME_MS", "HOROVOD_CYCLE_TIME"}, &col.cycle_time_ms);
  r.integer({"PUSHPULL_SMALL_ALLREDUCE_BYTES"}, &col.small_allreduce_bytes);
  r.integer({"PUSHPULL_RING_SEGMENT_BYTES"}, &col.ring_segment_bytes);
  r.real({"PUSHPULL_STALL_WARNING_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS"},
         &col.stall_warning_seconds);
  r.real({"PUSHPULL_STALL_SHUTDOWN_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"},
         &col.stall_shutdown_seconds);
  r.flag({"PUSHPULL_SHM"}, &col.shared_memory);
  r.integer({"PUSHPULL_SHM_MIN_MESSAGE_BYTES"}, &col.shm_min_message_bytes);
  r.integer({"PUSHPULL_SHM_ARENA_SLOT_BYTES"}, &col.shm_arena_slot_bytes);
  r.integer({"PUSHPULL_SHM_ARENA_STEP_BYTES"}, &col.shm_arena_step_bytes);
  r.string({"PUSHPULL_SHM_ARENA_STORES"}, &col.shm_arena_stores);
  if (auto v = r.find({"PUSHPULL_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLREDUCE"}).second;
      v && !v->empty()) {  // empty: automatic
    bool hierarchical = false;
    r.flag({"PUSHPULL_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLREDUCE"}, &hierarchical);
    col.hierarchical_allreduce = hierarchical ? 1 : 0;
  }
  r.string({"PUSHPULL_ELASTIC_ADDR"}, &col.elastic_addr);
  r.string({"PUSHPULL_ELASTIC_ID"}, &col.elastic_id);
  double elastic_s = 0;
  r.real({"PUSHPULL_ELASTIC_TIMEOUT"}, &elastic_s);
  if (elastic_s > 0) col.elastic_timeout = Millis(static_cast<int64_t>(elastic_s * 1000));

  o.observe = ObserveOptions::from_env(env);
  o.validate();
  // Last, after every value is checked: this may create the per-user file.
  resolve_job_secret(env, &n);
  if (n.tls && n.job_secret.empty())
    throw InvalidArgument(
        "PUSHPULL_TLS=1 needs a job secret (the TLS key is derived from it), and "
        "PUSHPULL_ALLOW_INSECURE=1 turns secrets off: unset one of them");
  return o;
}

ObserveOptions ObserveOptions::from_env(const Environment& env) {
  ObserveOptions o;
  Reader r(env);
  r.integer({"PUSHPULL_METRICS_PORT"}, &o.metrics_port);
  r.string({"PUSHPULL_METRICS"}, &o.metrics_file);
  r.integer({"PUSHPULL_METRICS_INTERVAL_MS"}, &o.metrics_interval_ms);
  if (o.metrics_interval_ms <= 0) o.metrics_interval_ms = 10000;
  if (o.metrics_port < 0 || o.metrics_port > 65535)
    throw InvalidArgument(
        fmt::format("PUSHPULL_METRICS_PORT={} is not in 0..65535", o.metrics_port));
  r.integer({"PUSHPULL_HOST_PROCESS_INDEX", "PUSHPULL_LOCAL_RANK", "LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"},
            &o.port_index);
  if (o.port_index < 0) o.port_index = 0;
  if (o.metrics_port > 0 && o.metrics_port + o.port_index > 65535)
    throw InvalidArgument(fmt::format("PUSHPULL_METRICS_PORT={} + process index {} is above 65535",
                                      o.metrics_port, o.port_index));
  r.string({"PUSHPULL_NODE_HOST", "DMLC_NODE_HOST"}, &o.bind_host);
  bool any = false;
  r.flag({"PUSHPULL_BIND_ANY"}, &any);
  if (any || o.bind_host.empty()) o.bind_host = any ? "0.0.0.0" : "127.0.0.1";
  r.integer({"PUSHPULL_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}, &o.rank);
  if (auto v = r.find({"PUSHPULL_ROLE", "DMLC_ROLE"}).second; v && !v->empty()) {
    o.role = *v;
    o.role_named = true;
  } else if (o.rank >= 0) {
    o.role = "worker";
  }
  r.integer({"PUSHPULL_FLIGHT_RECORDER_SIZE"}, &o.flight_recorder_size);
  if (o.flight_recorder_size < 0 || o.flight_recorder_size > (1 << 20))
    throw InvalidArgument(fmt::format("PUSHPULL_FLIGHT_RECORDER_SIZE={} is not in 0..1048576",
                                      o.flight_recorder_size));
  r.string({"PUSHPULL_FLIGHT_RECORDER_DIR"}, &o.flight_recorder_dir);
  r.string({"PUSHPULL_TIMELINE_CLOCK"}, &o.timeline_clock);
  // The first one set and not empty: an empty PUSHPULL_TIMELINE leaves
  // Horovod's name in charge.
  for (const char* name : {"PUSHPULL_TIMELINE", "HOROVOD_TIMELINE"})
    if (auto v = env.get(name); v && !v->empty()) {
      o.timeline = *v;
      break;
    }
  return o;
}

void Options::validate() const {
  auto check = [](bool ok, const std::string& what) {
    if (!ok) throw InvalidArgument(what);
  };
  check(net.port >= 0 && net.port < 65536,
        fmt::format("port {} is out of range 0..65535", net.port));
  check(net.max_message_bytes >= 4096, "max_message_bytes must be at least 4096");
  check(net.handshake_timeout.count() > 0,
        "handshake timeout must be positive (PUSHPULL_HANDSHAKE_TIMEOUT_MS)");
  check(cluster.root_port >= 0 && cluster.root_port < 65536,
        fmt::format("scheduler port {} is out of range 0..65535 (DMLC_PS_ROOT_PORT)",
                    cluster.root_port));
  check(cluster.num_servers >= 0,
        fmt::format("number of servers {} is negative (DMLC_NUM_SERVER)", cluster.num_servers));
  check(cluster.num_workers >= 1,
        fmt::format("number of workers {} must be at least 1 (DMLC_NUM_WORKER)",
                    cluster.num_workers));
  check(cluster.heartbeat_interval.count() > 0, "heartbeat interval must be positive");
  check(cluster.heartbeat_timeout > cluster.heartbeat_interval,
        "heartbeat timeout must be longer than the heartbeat interval");
  check(cluster.ps_replicas >= -1, "PUSHPULL_PS_REPLICAS must be 0 or more");
  check(kvstore.bigarray_bound > 0,
        "big-array bound must be positive (MXNET_KVSTORE_BIGARRAY_BOUND)");
  check(kvstore.chunk_bytes >= 4096, "PUSHPULL_PS_CHUNK_BYTES must be at least 4096");
  check(kvstore.server_threads >= 0, "server threads must not be negative");
  check(kvstore.engine_threads >= 0,
        "kvstore threads must not be negative (PUSHPULL_KVSTORE_THREADS)");
  check(kvstore.wait_timeout.count() > 0,
        "kvstore wait timeout must be positive (PUSHPULL_KVSTORE_WAIT_TIMEOUT_MS)");
  check(kvstore.ps_backup_workers >= 0,
        "backup workers must not be negative (PUSHPULL_PS_BACKUP_WORKERS)");
  check(kvstore.ps_backup_workers == 0 || cluster.role == Role::kNone ||
            kvstore.ps_backup_workers < cluster.num_workers,
        fmt::format("PUSHPULL_PS_BACKUP_WORKERS={} needs more workers than that: a dist_sync "
                    "round closes after num_workers - backup pushes, and the job has {} "
                    "worker(s)",
                    kvstore.ps_backup_workers, cluster.num_workers));
  check(kvstore.ps_backup_max_late >= 1, "PUSHPULL_PS_BACKUP_MAX_LATE must be at least 1");
  check(kvstore.checkpoint_every >= 0, "PUSHPULL_CHECKPOINT_EVERY must not be negative");
  check(kvstore.resume_round >= 0, "PUSHPULL_RESUME_ROUND must not be negative");
  check(collective.cycle_time_ms >= 0, "cycle time must not be negative");
  check(collective.ring_segment_bytes >= 4096, "ring segment must be at least 4096 bytes");
  check(collective.shm_arena_slot_bytes == 0 || (collective.shm_arena_slot_bytes >= 4096 &&
                                                 collective.shm_arena_slot_bytes <= (1u << 30)),
        "PUSHPULL_SHM_ARENA_SLOT_BYTES must be 0 (no arena) or 4096 .. 1 GiB");
  check(collective.shm_arena_step_bytes >= 4096 && collective.shm_arena_step_bytes <= (1u << 30),
        "PUSHPULL_SHM_ARENA_STEP_BYTES must be 4096 .. 1 GiB");
  check(collective.shm_arena_stores == "auto" || collective.shm_arena_stores == "cached" ||
            collective.shm_arena_stores == "streaming",
        "PUSHPULL_SHM_ARENA_STORES must be auto, cached or streaming, got '" +
            collective.shm_arena_stores + "'");
  check(collective.hierarchical_allreduce >= -1 && collective.hierarchical_allreduce <= 1,
        "hierarchical_allreduce must be -1 (automatic), 0 or 1");
}

}  // namespace pushpull
