// SPDX-License-Identifier: Apache-2.0
// Typed configuration with documented defaults.
//
// `Options::from_env()` is the only place in pushpull that reads environment
// variables. It accepts the MXNet / ps-lite names (DMLC_*), the torchrun names
// (RANK, WORLD_SIZE, ...), OpenMPI's and Slurm's, and PUSHPULL_* names; where
// two name the same setting the PUSHPULL_* one wins. A malformed value is an
// InvalidArgument naming the variable. Programs may also fill the structs by
// hand and never touch the environment (tests do).
//
// Thread safety: plain values.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "pushpull/log.h"

namespace pushpull {

using Millis = std::chrono::milliseconds;

// A snapshot of environment variables (name → value).
class Environment {
 public:
  Environment() = default;
  explicit Environment(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}
  Environment(std::initializer_list<std::pair<const std::string, std::string>> vars)
      : vars_(vars) {}
  // The calling process's environment, read now.
  static Environment current();
  std::optional<std::string> get(std::string_view name) const;
  // The first of `names` that is set.
  std::optional<std::string> first(std::initializer_list<std::string_view> names) const;
  void set(std::string name, std::string value) { vars_[std::move(name)] = std::move(value); }
  const std::map<std::string, std::string>& vars() const { return vars_; }

 private:
  std::map<std::string, std::string> vars_;
};

enum class Role : uint8_t { kNone = 0, kScheduler = 1, kServer = 2, kWorker = 3 };
std::string_view role_name(Role r);  // "none", "scheduler", "server", "worker"
std::optional<Role> parse_role(std::string_view text);

struct NetOptions {
  // Address this node advertises to others. DMLC_NODE_HOST / PUSHPULL_NODE_HOST.
  // Empty: chosen from `interface`, else the first non-loopback IPv4, else loopback.
  std::string node_host;
  // Network interface to take the address from. DMLC_INTERFACE / PUSHPULL_INTERFACE.
  std::string interface;
  // Port this node listens on; 0 = any free port. DMLC_PORT / PUSHPULL_PORT.
  int port = 0;
  // Largest message accepted from a peer; larger ones are protocol errors.
  // PUSHPULL_MAX_MESSAGE_BYTES.
  uint64_t max_message_bytes = uint64_t{2} << 30;
  // SO_SNDBUF / SO_RCVBUF per socket. PUSHPULL_SOCKET_BUFFER_BYTES. 0 = kernel default
  // (autotuning). -1 (the default) = automatic: a parameter-server node splits 256 KiB
  // among the peers it exchanges tensors with (a worker: its servers; a server: its
  // workers, and its fellow servers when ranges have backups), 32 to 128 KiB each; other
  // nodes take 128 KiB. Small enough that the flows into one port do not overfill a switch
  // queue when every link carries pushes one way and replies the other, large enough for a
  // LAN's bandwidth-delay product (docs/scaling.md, "Defaults"); the collective streams do
  // not use it (kernel autotuning). Set it for long fat links.
  int socket_buffer_bytes = -1;
  // How long connect() keeps retrying (with backoff). PUSHPULL_CONNECT_TIMEOUT_MS.
  Millis connect_timeout{30000};
  // Jobs only talk to nodes with the same id. PUSHPULL_JOB_ID.
  std::string job_id = "pushpull";
  // When set, both ends of every connection prove knowledge of it (HMAC-SHA256,
  // see docs/security.md). from_env() takes PUSHPULL_JOB_SECRET, else the file
  // PUSHPULL_JOB_SECRET_FILE names, else (unless allow_insecure) the per-user
  // secret file, created on first use (src/base/secret_file.h); an empty
  // PUSHPULL_JOB_SECRET counts as unset. Options built in code without one
  // keep the old rule below (this machine's peers only).
  std::string job_secret;
  // Where job_secret came from, for error messages: "PUSHPULL_JOB_SECRET",
  // "PUSHPULL_JOB_SECRET_FILE=<path>", "the per-user secret file <path>", or
  // empty (set in code).
  std::string job_secret_source;
  // Without a job secret a node accepts and dials peers on this machine only;
  // true accepts any peer unauthenticated (trusted, isolated networks), and is
  // the only way from_env() leaves job_secret empty. PUSHPULL_ALLOW_INSECURE=1.
  bool allow_insecure = false;
  // Every connection (the parameter server's, the collectives' control and
  // data streams) runs over TLS 1.3 keyed from job_secret (transport/tls.h,
  // docs/security.md "Encryption"). Needs a secret. PUSHPULL_TLS=1.
  bool tls = false;
  // Listen on every address instead of the advertised one. PUSHPULL_BIND_ANY=1.
  bool bind_any = false;
  // A listening socket inherited from `pushpull launch` (internal: set for
  // worker 0 of a `-s 0` job, whose rendezvous port the launcher bound and
  // held; transport::take_inherited_listener). PUSHPULL_LISTEN_FD, a descriptor number.
  std::string inherited_listener;
  // How long an accepted connection may take to authenticate (capped by
  // connect_timeout). PUSHPULL_HANDSHAKE_TIMEOUT_MS.
  Millis handshake_timeout{10000};
  // Workers and servers on one host move message payloads through shared
  // memory instead of loopback TCP (docs/transport.md, "Same host").
  // PUSHPULL_PS_SHM=0 turns it off.
  bool ps_shared_memory = true;
  // With ps_shared_memory, a primary server lends its replicas to backups on
  // the same host (they copy the value straight out of its memory, one copy
  // instead of two; docs/ps.md "Replication on one host"), and a backup
  // reads what it is lent. PUSHPULL_PS_LEND=0 turns both off for this node:
  // replicas then travel by value.
  bool ps_lend = true;
};

struct ClusterOptions {
  // DMLC_ROLE / PUSHPULL_ROLE. kNone for a plain program (local stores).
  Role role = Role::kNone;
  // Scheduler address. DMLC_PS_ROOT_URI / PUSHPULL_ROOT_URI.
  std::string root_uri = "127.0.0.1";
  // DMLC_PS_ROOT_PORT / PUSHPULL_ROOT_PORT.
  int root_port = 9091;
  // DMLC_NUM_SERVER / PUSHPULL_NUM_SERVER.
  int num_servers = 0;
  // DMLC_NUM_WORKER / PUSHPULL_NUM_WORKER.
  int num_workers = 1;
  // Heartbeat period. PUSHPULL_HEARTBEAT_INTERVAL_MS.
  Millis heartbeat_interval{1000};
  // A node silent for this long is declared dead; also the deadline of every
  // wait on a peer. PUSHPULL_HEARTBEAT_TIMEOUT_MS, or PUSHPULL_TIMEOUT (seconds,
  // set by the launcher's --timeout) for this and startup_timeout together.
  Millis heartbeat_timeout{10000};
  // How long registration may take before the job fails. PUSHPULL_STARTUP_TIMEOUT_MS.
  Millis startup_timeout{120000};
  // Deadline of a barrier and of the orderly shutdown (waiting for every node
  // to leave). PUSHPULL_BARRIER_TIMEOUT_MS.
  Millis barrier_timeout{600000};
  // Rank the launcher assigned (-1: assigned by the scheduler). PUSHPULL_RANK.
  int preferred_rank = -1;
  // Parameter-server backups per key range (docs/ps.md, "Fault tolerance"):
  // -1 = the default (1 when there are at least 2 servers), 0 = off; at most
  // servers - 1 are used. PUSHPULL_PS_REPLICAS.
  int ps_replicas = -1;
  // Workers also connect to each other (a mesh, n(n-1)/2 connections): only
  // tests that send worker to worker and `bench startup`'s `ps_mesh` (the
  // topology before issue 38) use it; a worker talks to the servers and the
  // scheduler only, so start-up stays linear in the job (docs/scaling.md).
  // Set in code, not from the environment.
  bool worker_mesh = false;
  // A worker's collectives mesh listener, bound before it registers: the
  // port travels in its registration and reaches every worker in the address
  // book (NodeAddress::mesh_port), so the collectives' bootstrap through the
  // scheduler needs no worker-to-worker exchange (src/collective/
  // bootstrap.cpp). 0: none. Set in code, not from the environment.
  int mesh_port = 0;
  // Test hook (tests/e2e/ps_restart_test.cpp): a restarted server stops
  // itself (SIGSTOP) right after asking the live servers for its key ranges,
  // as a SIGSTOP landing while it catches up would.
  // PUSHPULL_TEST_STOP_WHILE_CATCHING_UP=1.
  bool test_stop_while_catching_up = false;
};

struct KVStoreOptions {
  // Arrays with at least this many elements are split over all servers.
  // MXNET_KVSTORE_BIGARRAY_BOUND / PUSHPULL_BIGARRAY_BOUND. 65536 (256 KiB of float32),
  // not MXNet's 1,000,000: a layer's push and pull then use every server link at once
  // instead of one (docs/scaling.md, "Defaults").
  int64_t bigarray_bound = 65536;
  // Parameter-server messages carry at most this many bytes of one value: a
  // bigger slice travels as several chunks, so the network, the server's
  // summing and the pull replies overlap. PUSHPULL_PS_CHUNK_BYTES.
  int64_t chunk_bytes = 4 << 20;
  // Threads a server uses for summing and updates; 0 = min(cores, 4).
  // PUSHPULL_SERVER_THREADS.
  int server_threads = 0;
  // Threads of a local store's engine; 0 = min(cores, 4). PUSHPULL_KVSTORE_THREADS.
  int engine_threads = 0;
  // Deadline of the blocking KVStore calls (push, pull, wait_all, ...): a call
  // whose work is not done by then throws Timeout. PUSHPULL_KVSTORE_WAIT_TIMEOUT_MS.
  Millis wait_timeout{600000};
  // What the key authenticating a PS job's optimizer-state files
  // (save_optimizer_states / load_optimizer_states; base/file_auth.h,
  // docs/security.md) is derived from, the same key as checkpoints': the
  // variables base::checkpoint_key reads (PUSHPULL_CHECKPOINT_KEY_FILE, else
  // the per-user secret file: PUSHPULL_SECRET_FILE, XDG_CONFIG_HOME, HOME;
  // PUSHPULL_ALLOW_INSECURE; and PUSHPULL_CHECKPOINT_KEY_ID, which a
  // launched server checks its key against), as from_env() found them. The secret is read
  // (or created) only when a file is saved or loaded. Empty (Options built
  // in code): the per-user secret file under this user's passwd home.
  Environment file_key_env;
  // Backup workers in dist_sync (docs/ps.md "Backup workers"): a round of a
  // key closes once the first num_workers - b pushes arrived; the others'
  // pushes of that round are dropped, and the sum is scaled by
  // num_workers / (num_workers - b). 0 = every push counts (the default).
  // Must be below the number of workers. PUSHPULL_PS_BACKUP_WORKERS.
  int ps_backup_workers = 0;
  // With backup workers: how many rounds a worker may fall behind before a
  // round waits for its push again (the server keeps that many earlier
  // values of each key to answer its pulls). PUSHPULL_PS_BACKUP_MAX_LATE.
  int ps_backup_max_late = 8;
  // How big values are shared among the servers (docs/ps.md "Mixed
  // placement"): "auto" (equal shares, except when some servers have hosts
  // of their own and others share a host with workers: then BytePS's split,
  // which balances the spare hosts' links against the worker hosts'),
  // "equal", or one positive weight per server rank ("1,1,0.5,0.5").
  // Every worker must use the same value. PUSHPULL_PS_SERVER_WEIGHTS.
  std::string ps_server_weights = "auto";
  // Server checkpoints (docs/ps.md "Checkpoints"), set by `pushpull launch
  // --checkpoint-dir / --resume`: where servers write them
  // (PUSHPULL_CHECKPOINT_DIR; empty: none) and every how many rounds
  // (PUSHPULL_CHECKPOINT_EVERY), and where and which round they resume from
  // (PUSHPULL_RESUME_DIR; empty: a fresh job, and PUSHPULL_RESUME_ROUND).
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  std::string resume_dir;
  int64_t resume_round = 0;
};

struct CollectiveOptions {
  // This process's place among the workers, from the launcher or RANK /
  // OMPI_COMM_WORLD_RANK / SLURM_PROCID; -1 when unknown.
  int rank = -1;
  int size = -1;        // WORLD_SIZE / OMPI_COMM_WORLD_SIZE / SLURM_NTASKS
  int local_rank = -1;  // LOCAL_RANK / OMPI_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID
  int local_size = -1;  // LOCAL_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE
  // Rendezvous hosted by rank 0 when there is no scheduler. MASTER_ADDR / MASTER_PORT.
  std::string master_addr;
  int master_port = 0;
  // Tensor fusion buffer size. PUSHPULL_FUSION_THRESHOLD (bytes), HOROVOD_FUSION_THRESHOLD.
  uint64_t fusion_threshold_bytes = uint64_t{64} << 20;
  // How long the engine collects ready tensors before a round. PUSHPULL_CYCLE_TIME_MS.
  double cycle_time_ms = 1.0;
  // Allreduce below this many bytes uses the log-latency algorithm.
  // PUSHPULL_SMALL_ALLREDUCE_BYTES.
  uint64_t small_allreduce_bytes = 64 << 10;
  // Ring pipeline segment size. PUSHPULL_RING_SEGMENT_BYTES.
  uint64_t ring_segment_bytes = 1 << 20;
  // PUSHPULL_STALL_WARNING_SECONDS.
  double stall_warning_seconds = 60;
  // 0 = never. PUSHPULL_STALL_SHUTDOWN_SECONDS.
  double stall_shutdown_seconds = 0;
  // Collective data between ranks of one host through shared memory, the
  // host found by identity and a probe (docs/collectives.md). PUSHPULL_SHM=0
  // turns it off.
  bool shared_memory = true;
  // With shared memory on: an operation whose messages are all smaller than
  // this runs on the TCP mesh's direct streams instead (the algorithm's
  // thread drives them; a shared-memory message crosses two progress
  // threads, which costs more than the copy below this size). 0: every
  // message through shared memory. PUSHPULL_SHM_MIN_MESSAGE_BYTES.
  uint64_t shm_min_message_bytes = 512 << 10;
  // The shared-memory arena of a one-host allreduce (docs/collectives.md):
  // each rank's two slots, and the bytes one lock-step of the arena moves.
  // Every rank of a host must use the same slot size (the segments'
  // layout). PUSHPULL_SHM_ARENA_SLOT_BYTES, PUSHPULL_SHM_ARENA_STEP_BYTES.
  uint64_t shm_arena_slot_bytes = 1 << 20;
  uint64_t shm_arena_step_bytes = 128 << 10;
  // How a rank writes the chunks its peers read from its slots: "cached"
  // (they read them from this core's cache), "streaming" (non-temporal
  // stores: through memory), or "auto" (each rank measures both by the CPU
  // time they cost on allreduces of 4 MiB and more and keeps the cheaper).
  // The result has the same bits either way, so ranks need not agree.
  // PUSHPULL_SHM_ARENA_STORES.
  std::string shm_arena_stores = "auto";
  // Hierarchical allreduce (docs/collectives.md): -1 = automatic (used when the
  // group spans >= 2 hosts with the same number >= 2 of ranks on each), 0 =
  // never, 1 = whenever every host has the same number of ranks.
  // PUSHPULL_HIERARCHICAL_ALLREDUCE, HOROVOD_HIERARCHICAL_ALLREDUCE (1 or 0;
  // unset = automatic).
  int hierarchical_allreduce = -1;
  // Set by `pushpull launch --min-workers/--max-workers` (docs/elastic.md):
  // the launcher's elastic rendezvous as host:port (empty: not elastic), this
  // worker's id there, and how long a join may wait for a round.
  // PUSHPULL_ELASTIC_ADDR, PUSHPULL_ELASTIC_ID, PUSHPULL_ELASTIC_TIMEOUT (seconds).
  std::string elastic_addr;
  std::string elastic_id;
  Millis elastic_timeout{600000};
};

// Observability of one process (docs/timeline.md): the Prometheus endpoint,
// the flight recorder and the timeline's clock alignment. Read by the
// process-wide recorders through ObserveOptions::from_env (also filled in
// Options::from_env).
struct ObserveOptions {
  // PUSHPULL_METRICS_PORT=P: serve the metrics counters in Prometheus text
  // format at http://<advertised address>:(P + port_index)/metrics. 0: off.
  int metrics_port = 0;
  // PUSHPULL_METRICS=F: the counters as JSON lines to F.<role><rank>.jsonl
  // every PUSHPULL_METRICS_INTERVAL_MS (default 10000).
  std::string metrics_file;
  int metrics_interval_ms = 10000;
  // The process's index among the job's processes on its host: the launcher
  // sets PUSHPULL_HOST_PROCESS_INDEX (its servers, then its workers, in plan
  // order); without it, the local rank (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
  // SLURM_LOCALID), else 0.
  int port_index = 0;
  // Where the endpoint binds: the advertised address (PUSHPULL_NODE_HOST,
  // DMLC_NODE_HOST; default 127.0.0.1), every interface with PUSHPULL_BIND_ANY=1.
  std::string bind_host = "127.0.0.1";
  // This process's role and rank (labels, file names): PUSHPULL_ROLE /
  // DMLC_ROLE ("worker" when only a rank is known, "process" when neither),
  // PUSHPULL_RANK / RANK / ... (-1: unknown).
  std::string role = "process";
  int rank = -1;
  // Whether PUSHPULL_ROLE / DMLC_ROLE named the role: the timeline calls a
  // process known only by its rank "rank N", not "worker N" (docs/timeline.md).
  bool role_named = false;
  // The timeline's file stem F (PUSHPULL_TIMELINE, else HOROVOD_TIMELINE);
  // each process writes F.<role><rank>.json. "": no timeline.
  std::string timeline;
  // The flight recorder (docs/timeline.md, "Flight recorder"): how many of
  // the last operations it keeps (0: off), PUSHPULL_FLIGHT_RECORDER_SIZE; the
  // directory of its dumps, PUSHPULL_FLIGHT_RECORDER_DIR ("": the working
  // directory).
  int flight_recorder_size = 1024;
  std::string flight_recorder_dir;
  // The launcher's clock service (host:port, UDP) the timeline measures its
  // clock offset against; set by `pushpull launch --timeline-filename`.
  // PUSHPULL_TIMELINE_CLOCK.
  std::string timeline_clock;

  static ObserveOptions from_env(const Environment& env = Environment::current());
};

struct Options {
  // PUSHPULL_LOG_LEVEL; from_env() also applies it to this process's log
  // (set_log_level), so a library user's PUSHPULL_LOG_LEVEL=debug works
  // without a call of its own.
  LogLevel log_level = LogLevel::kInfo;
  NetOptions net;
  ClusterOptions cluster;
  KVStoreOptions kvstore;
  CollectiveOptions collective;
  ObserveOptions observe;

  // Reads every setting above from `env` (the process environment by default).
  static Options from_env(const Environment& env = Environment::current());
  // Throws InvalidArgument when a setting is out of range.
  void validate() const;
};

}  // namespace pushpull
