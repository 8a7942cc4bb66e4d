// SPDX-License-Identifier: Apache-2.0
// A deterministic simulation of parameter-server recovery (docs/reliability.md,
// "Deterministic simulation"), in the spirit of FoundationDB's simulator: one
// thread, a simulated clock and network, every choice drawn from one seed.
//
// What is real and what is a model:
// - real: every server's ps::ServerStore (rounds, the optimizer and its
//   states, duplicate detection, re-publishing before acknowledging a
//   re-sent push or init, replica installation), run without threads
//   (ServerStoreConfig::threads = 0); the placement arithmetic
//   (cluster::replica_chain, first_lost_home); the optimizers.
// - models, written after the code they stand for: the network (per-link
//   FIFO, random delays, connections closed by kills and fail-overs: a
//   message sent on a closed connection is lost), the scheduler's failure
//   handling (scheduler_failures.cpp: death, heartbeat timeout, placement
//   epochs, "no replica left"), a server's replication (ps::Server::
//   replicate: live backups after it in the chain, acknowledgements, a
//   placement completing the wait for dead ones, requests of a newer epoch
//   held) and a worker's store (dist_store*.cpp: sequence numbers per part,
//   requests re-sent to the new primary on a placement, init re-sent).
//
// Faults, at random moments: a server killed; a server stopped and continued
// later (a zombie that wakes up after it was failed over, or before its
// heartbeat timeout); a worker killed and restarted with its rank (it
// rejoins through the real ServerStore::rejoin and re-sends its round;
// epoch-end barriers run through the real cluster::BarrierBook); links cut
// for a while (shorter than the heartbeat timeout between data nodes; any
// length between the scheduler and a server); delays and bursts of them on
// any link. The checker:
// every value a worker pulls equals the reference (the same optimizer run on
// one copy, bit for bit: per-element distinct values and a key split over
// two servers, so offset or chunk mix-ups show), in dist_async the exact
// total; no hang (the event queue never empties, and the clock never passes
// the job's deadline, while a worker waits); a job whose fault schedule left
// every range a live server finishes.
//
// Thread safety: none (one thread). Ownership: World owns everything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pushpull::sim {

struct Fault {
  // kKillWorker: `server` is the worker's rank; the launcher restarts it
  // (--max-restarts) after `continue_after_us`.
  // kPartition: the link between server `server` and the peer (the
  // scheduler, a worker or another server) is cut for `continue_after_us`
  // (TCP retransmits: messages wait, in order). Cut from the scheduler for
  // the heartbeat timeout or longer, the server is failed over (and exits:
  // it does not hear the scheduler either).
  enum Kind { kKill, kStop, kKillWorker, kPartition } kind = kKill;
  int server = 0;
  uint64_t at_us = 0;
  // kStop: continued this long after (0: never); kKill: restarted this long
  // after its fail-over (0: not restarted); kKillWorker: restarted after.
  uint64_t continue_after_us = 0;
  enum PeerRole { kScheduler, kServer, kWorker } peer_role = kScheduler;
  int peer = 0;
  std::string describe() const;
};

struct Scenario {
  uint64_t seed = 0;
  int servers = 4;
  int workers = 3;
  int replicas = 1;
  bool sync = true;
  int rounds = 12;
  int barrier_every = 0;  // dist_sync: kv.barrier() after every this many rounds (0: none)
  std::vector<Fault> faults;
  std::string describe() const;
};

struct Outcome {
  bool finished = false;                // every worker completed every round
  bool failed_cleanly = false;          // the job failed, with a reason (no replica left)
  std::string failure;                  // that reason
  std::vector<std::string> violations;  // wrong values, hangs, lost survival
  uint64_t events = 0;
  uint64_t end_us = 0;
};

// The scenario a seed stands for (servers, replicas, mode, faults).
Scenario scenario_for_seed(uint64_t seed);
// Runs one scenario to its end.
Outcome run(const Scenario& s);

}  // namespace pushpull::sim
