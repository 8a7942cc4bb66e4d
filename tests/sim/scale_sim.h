// SPDX-License-Identifier: Apache-2.0
// The control plane at scale (issue 38; docs/scaling.md "The control plane
// at 1,024 and 4,096 ranks"): one process, one thread, a simulated network
// and a manual clock, thousands of ranks. It reports what each rank costs the
// job's control plane: connections, messages and bytes at start-up and per
// heartbeat interval, the simulated start-up time under a stated cost per
// message, and how long a stopped or killed rank takes to be named.
//
// What is real and what is a model:
// - real (the code the job runs, called here): the cluster's codecs
//   (cluster::encode_register / decode_register, encode_book / decode_book,
//   encode_dead: their byte counts are what travels), the handshake's codecs
//   (transport::encode of Challenge, Hello, HelloAck), the scheduler's barriers
//   (cluster::BarrierBook), the failure detectors' timers (SilenceDetector
//   on a ManualClock, base/liveness.h), the PS servers' ps::ServerStore (no
//   threads) answering one dist_sync pushpull, the collectives' rendezvous
//   codecs (collective::encode_entry / encode_verdict), the engine's
//   negotiation (collective::Coordinator, ResponseCache, encode(Announce),
//   encode(responses) and their decoders).
// - models, written after the code they stand for, because that code is
//   welded to sockets and threads: the scheduler's registration, rank
//   assignment and heartbeat loop (cluster/scheduler.cpp: Scheduler::run,
//   on_message, assign_ranks, check_timers), a node's start-up and
//   heartbeats (cluster/node.cpp Node::start, node_liveness.cpp), the dist_sync
//   store's creation (kvstore/dist_store.cpp: rank 0's kSetMode to every
//   server, then a workers' barrier), the collectives' rendezvous and mesh
//   (collective/bootstrap.cpp, store.cpp, tcp_transport.cpp connect_all:
//   the higher rank dials the lower one, one after another; one data stream
//   per pair, tcp_streams.h), their detector (tcp_transport_liveness.cpp:
//   heartbeats to every peer, verdicts to every peer, a closed connection
//   blamed after the grace), the small allreduce (recursive doubling with the
//   non-power-of-two fold of halving_doubling.cpp). The sparse topology is
//   the design of issue 38 (ring neighbours + halving-doubling partners + the
//   host's local ranks, dialed in parallel; heartbeats to the two ring
//   neighbours only; a verdict forwarded over the links in use).
//
// Costs (Costs below): every message costs its sender's and its receiver's
// control thread `per_message_us` (one thread per node, messages in the
// order they were sent), plus its bytes at `link_bytes_per_us` on the
// sender; it travels `latency_us`. A connection is a TCP handshake (one
// round trip in the kernel, free) then the hello (3 messages); a
// collectives data stream one more connection and 2 messages. Processes all
// start at time 0.
//
// Thread safety: none (one thread). Ownership: each run owns its world.
#pragma once

#include <cstdint>
#include <string>

namespace pushpull::sim::scale {

// How long a run may take to start up, in simulated time.
inline constexpr uint64_t kStartupLimitUs = 600'000'000;

struct Costs {
  uint64_t per_message_us = 100;
  uint64_t latency_us = 50;
  double link_bytes_per_us = 1250;  // 10 Gbit/s
};

enum class Topology { kFullMesh, kSparse };
enum class Fault { kStop, kKill };  // SIGSTOP (silence) or SIGKILL (connections close)

struct Config {
  int ranks = 1024;                         // PS workers, or collective ranks
  int servers = 2;                          // PS
  bool worker_mesh = false;                 // PS: the worker mesh before issue 38
  Topology topology = Topology::kFullMesh;  // collectives
  // Ranks per host: the collectives' local ranks (the sparse topology), and
  // a PS job's workers per host (servers have hosts of their own), which the
  // address book names once each (transport/host_table.h).
  int local_size = 8;
  Fault fault = Fault::kStop;
  int victim = -1;  // the rank stopped or killed; -1: the last one
  Costs costs;
  uint64_t heartbeat_interval_us = 1'000'000;  // ClusterOptions' defaults
  uint64_t heartbeat_timeout_us = 10'000'000;
};

// A per-rank quantity over the ranks (PS: the workers; collectives: every
// rank but rank 0) and at the hub (the scheduler; rank 0).
struct Spread {
  double mean = 0;
  double max = 0;
  double hub = 0;
};

struct Report {
  std::string engine;  // "ps", "ps (worker mesh)", "collective full mesh", "collective sparse"
  int ranks = 0;
  Spread connections;
  Spread startup_messages, startup_bytes;      // sent + received, until every store is ready
  Spread heartbeat_messages, heartbeat_bytes;  // sent + received, per interval, steady state
  Spread heartbeat_cpu;  // the control thread's busy share for heartbeats (0..1+)
  // Collectives: messages and bytes through rank 0 per operation of the
  // negotiation (first submission, then a repeat answered from the cache).
  double op_messages_hub = 0, op_bytes_hub_first = 0, op_bytes_hub_cached = 0;
  // The same repeat over the negotiation tree (collective/negotiation_tree.h):
  // rank 0's messages (sent + received) and bytes, and, for both paths, the
  // simulated time from the announcements to the last rank holding the
  // response.
  double op_messages_hub_tree = 0, op_bytes_hub_tree = 0;
  double negotiate_direct_ms = 0, negotiate_tree_ms = 0;
  // Simulated: when the last rank's store was ready; -1 when that did not
  // happen within kStartupLimitUs (the other fields are then empty).
  double startup_s = 0;
  double round_ms = 0;  // one pushpull / allreduce of 4 floats after start-up
  bool values_ok = false;
  double detect_first_s = 0;  // fault -> the first node names the victim
  double detect_all_s = 0;    // fault -> every live node knows
  std::string verdict;        // how the victim was named (by the first node)
  uint64_t events = 0;
  std::string failure;  // why the run is invalid ("" when it ran through)
};

Report run_ps(const Config& c);
Report run_collective(const Config& c);

}  // namespace pushpull::sim::scale
