// SPDX-License-Identifier: Apache-2.0
// `pushpull bench scaling` internals (also used by `pushpull bench ps --netns`):
//
// - bench_scaling.cpp: the command line, the study loop, the table / csv;
// - bench_scaling_run.cpp: one run of one configuration on a NetnsLab (the
//   scheduler, servers and workers as processes in their host namespaces);
// - bench_scaling_worker.cpp: one worker process (the simulated step);
// - bench_scaling_ps.cpp: `bench ps --netns` (push+pull of one big value).
//
// The simulated data-parallel step (same in every worker, Gloo's included,
// bench/peers/gloo_step.cpp): forward = compute/3 of sleeping, then the
// backward's 2/3 split into `layers` equal shares; when layer l's share ends
// (last layer first, as backpropagation goes) its gradient of grad_bytes /
// layers is handed to the engine without waiting, so communication overlaps
// the rest of the backward; the step ends when every layer's reduced value is
// back. Sleeps stand in for a GPU: the 2 cores of this machine only run the
// communication. Sleeps end at absolute deadlines from the step's start, so
// oversleeping does not accumulate across layers.
//
// Results: every worker writes DIR/result.<rank> (one line per timed step:
// its duration in ms, then "elapsed <s>" and "wait <ms>" lines); the parent
// reads them after the run.
// Thread safety: none (one thread drives a benchmark).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pushpull::cli {

class NetnsLab;

struct StepSpec {
  double compute_ms = 400;
  uint64_t grad_bytes = 5ull << 20;
  int layers = 16;
  int warmup = 2;
  int steps = 10;
};

// What one run starts. impl: "pushpull_ring", "gloo_ring", "pushpull_ps" or
// "none" (one worker, compute only: the baseline of scaling efficiency).
struct RunSpec {
  std::string impl;
  int workers = 1;
  int servers = 0;         // pushpull_ps only
  bool colocated = false;  // pushpull_ps: server s on worker host s (servers == workers)
  // pushpull_ps: PUSHPULL_PS_REPLICAS of the job. The studies default to 0,
  // the parameter server MXNet's study and BytePS's bound describe; backups
  // add one value's bytes per server link per round (docs/scaling.md).
  int ps_replicas = 0;
  // pushpull_ps: `servers` spare hosts plus a server on every worker host,
  // big values shared by BytePS's split (docs/ps.md "Mixed placement").
  bool hybrid = false;
  // The last worker's compute time is this many times the others' (a
  // straggler); its own steps are then left out of the step time (the job's
  // pace is what the others see).
  double straggler = 1;
  // pushpull_ps: PUSHPULL_PS_BACKUP_WORKERS of the job (docs/ps.md).
  int backup_workers = 0;
};

// "pushpull_ps", "pushpull_ps_b1_slow2x", ...: the impl, its backup workers
// and its straggler.
std::string run_label(const RunSpec& s);

struct RunResult {
  bool ok = false;
  std::string failure;
  double elapsed_s = 0;             // slowest worker's wall time of the timed steps
  std::vector<double> step_ms;      // per timed step, the slowest worker's
  double wait_ms = 0;               // mean time a step waited after its backward (slowest worker)
  std::vector<uint64_t> server_rx;  // bytes each server host received during the run
  std::vector<uint64_t> server_tx;  // and sent
  double cpu_busy = 0;  // share of this machine's cores busy during the timed steps (all users)
};

// Worker host h is lab host h; dedicated server host s is lab host
// worker_hosts + s. `port` is a TCP port free in every namespace of the lab
// (a fresh one per run: the previous run's sockets may linger in TIME_WAIT).
RunResult run_config(const NetnsLab& lab, int worker_hosts, const StepSpec& step,
                     const RunSpec& spec, int timeout_s, int port);

struct ScalingWorkerArgs {
  std::string impl;  // "pushpull_ring", "pushpull_ps" or "none"
  int rank = 0;
  int workers = 1;
  std::string dir;  // where result.<rank> goes
  StepSpec step;
};

// One worker (blocking); configured for its engine by the environment the
// parent set (RANK/WORLD_SIZE/MASTER_ADDR for the ring, DMLC_* for the PS).
int run_scaling_worker(const ScalingWorkerArgs& args);

// argv tail that makes a child `pushpull bench scaling` run a worker.
std::vector<std::string> worker_argv(const std::string& impl, int rank, int workers,
                                     const std::string& dir, const StepSpec& step);

// `pushpull bench ps --netns H` (bench_scaling_ps.cpp).
struct PsNetnsSettings {
  int workers = 8;
  std::vector<int> servers = {1, 2, 4, 8};
  uint64_t bytes = 40ull << 20;
  std::string rate = "1gbit";
  int queue_ms = 50;  // tbf latency of every port (NetnsLab)
  int iters = 5;
  int warmup = 1;
  int repeats = 1;
  bool ring = true;       // also the ring allreduce of the same size
  bool dedicated = true;  // rows with S dedicated server hosts
  bool hybrid = false;    // rows with S spare hosts + a server per worker host
  int ps_replicas = 0;    // RunSpec::ps_replicas
  bool csv = false;
  int timeout_s = 600;
};
void run_ps_netns(const PsNetnsSettings& s);

// Machine-wide CPU time counters from /proc/stat (busy, total), in jiffies.
std::pair<uint64_t, uint64_t> cpu_jiffies();

}  // namespace pushpull::cli
