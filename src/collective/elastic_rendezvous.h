// SPDX-License-Identifier: Apache-2.0
// The driver's side of the elastic rendezvous (protocol: elastic_protocol.h):
// the launcher owns one for the whole job; it outlives every worker, so the
// group can re-form whichever workers die (rank 0 included).
//
// Rounds. The driver tells the server which workers are alive
// (add_worker / remove_worker, as it spawns and reaps them). A worker asks to
// join with its mesh listener's address. A round forms (poll()) when
//  - no round exists yet (the job's start): every live worker has asked, or
//    `startup_window` passed since the first asked;
//  - a round exists: every live member of the current round has asked again
//    (they do after a failure or a host change), or `member_window` passed
//    since the first of them asked: the members that did not ask are then
//    stragglers (hung): poll() returns them and the driver kills them.
// Workers that are not members (freshly started) join whichever round forms
// after they asked; a round never waits for them otherwise. A fresh worker
// asking while a healthy round runs makes the server announce a host change
// (kHostsType) to the members, who re-form at their next commit.
// A round needs at least `min_workers` members; with fewer asking, nothing
// forms (the driver decides when the job fails, and then calls refuse_all).
// Ranks: the members of the previous round keep their order (its rank 0, the
// holder of the committed state, stays rank 0 while alive), new workers
// follow in the order they asked.
//
// Stale members: a worker the driver removed (died, dropped as a straggler,
// its host gone) is declined; a round's mesh uses its own job id
// (round_job_id), so a member of an older round cannot connect into it.
//
// Thread safety: every method is thread-safe; the net I/O thread runs the
// handlers. Ownership: owns its transport::MessageTransport (stopped by the destructor).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "collective/elastic_protocol.h"
#include "pushpull/options.h"

namespace pushpull::collective::elastic {

struct ServerConfig {
  NetOptions net;         // job id and secret: the workers' must match
  std::string bind_host;  // "" = every IPv4 address
  int port = 0;           // 0 = a free one
  int min_workers = 1;
  Millis startup_window{120000};
  Millis member_window{30000};
};

struct RoundInfo {
  uint64_t round = 0;                // 0: none formed yet
  std::vector<std::string> members;  // worker ids by rank
};

class RendezvousServer {
 public:
  explicit RendezvousServer(ServerConfig config);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  int port() const;
  // Worker `id` runs (spawned) / is gone. remove_worker tells the current
  // round's other members at once (kMemberGoneType, `why`) when `id` was a
  // member, so their pending collectives fail without waiting for the
  // heartbeat timeout.
  // `announce` false: a worker that finished (exit 0) leaves quietly. Its
  // round's other members may still be finishing their own last steps; told
  // "member gone", a slower one would re-form alone and fail after training
  // finished. (If one still needs it, its mesh detects the closed peer.)
  void add_worker(const std::string& id);
  void remove_worker(const std::string& id, const std::string& why, bool announce = true);
  // Forms a round when the rules above say so; returns the stragglers it
  // left out (the caller kills them). Call every few hundred ms.
  std::vector<std::string> poll();
  // Every waiting and later join is declined with `why` (the job ends).
  void refuse_all(const Status& why);
  RoundInfo current() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace pushpull::collective::elastic
