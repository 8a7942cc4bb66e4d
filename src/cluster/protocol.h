// SPDX-License-Identifier: Apache-2.0
// Cluster control messages (types 16..63 of transport/message.h) and their payloads.
//
//   kRegister     node -> scheduler   {role, preferred rank, host, port}
//   kAddressBook  scheduler -> node   {your rank, AddressBook, restart flags,
//                                     your incarnation}
//   kBarrier      node -> scheduler   key = group, request_id = the node's barrier count,
//                                     offset = position + 1 (0: untracked), length = the
//                                     barrier's seq at that position (barrier_book.h)
//   kBarrierPass  worker -> scheduler offset = position: a replacement's first push; it
//                                     is past every barrier at that position or before
//   kBarrierDone  scheduler -> node   key = group, request_id = that count
//   kHeartbeat    both ways           empty
//   kPeerDead     scheduler -> node   {role, rank, host, port, reason}
//   kAbort        scheduler -> node   {reason} (e.g. registration timed out)
//   kLeave        node -> scheduler   empty: this node is done
//   kShutdown     scheduler -> node   every node has left: close now
//   kWorkersDone  scheduler -> server every worker has left (servers leave then)
//   kFailureReport node -> scheduler  {reporter's address, reason}: an engine of
//                                     the node found the job failed (e.g. the
//                                     collectives' detector); the scheduler ends
//                                     the job with that reason (kAbort)
//   kPlacement    scheduler -> node   {epoch, dead servers}: a server died and
//                                     every key range it held has a live
//                                     backup, which is now its primary
//                                     (parameter-server fail-over, docs/ps.md)
//   kServerRejoined server -> scheduler  empty: a restarted server received
//                                     its ranges from every live server; it
//                                     is alive again, last in its chains
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/options.h"
#include "transport/message.h"

namespace pushpull::cluster {

namespace msg {
inline constexpr uint16_t kRegister = 16;
inline constexpr uint16_t kAddressBook = 17;
inline constexpr uint16_t kBarrier = 18;
inline constexpr uint16_t kBarrierDone = 19;
inline constexpr uint16_t kHeartbeat = 20;
inline constexpr uint16_t kPeerDead = 21;
inline constexpr uint16_t kAbort = 22;
inline constexpr uint16_t kLeave = 23;
inline constexpr uint16_t kShutdown = 24;
inline constexpr uint16_t kWorkersDone = 25;
inline constexpr uint16_t kFailureReport = 26;
inline constexpr uint16_t kPlacement = 27;
inline constexpr uint16_t kServerRejoined = 28;
inline constexpr uint16_t kBarrierPass = 29;
inline constexpr uint16_t kLast = 29;
}  // namespace msg

// Barrier groups (bit set; kAll = servers and workers, not the scheduler).
enum class Group : uint8_t { kWorkers = 1, kServers = 2, kAll = 3 };
std::string_view group_name(Group g);

struct NodeAddress {
  Role role = Role::kNone;
  int32_t rank = -1;
  std::string host;
  int32_t port = 0;
  // A worker's collectives mesh port (ClusterOptions::mesh_port; 0: none).
  int32_t mesh_port = 0;
  // "worker 2 (host 10.0.0.2:9000)", or "worker (host ...)" before ranks exist.
  std::string describe() const;
};

struct AddressBook {
  NodeAddress scheduler;
  std::vector<NodeAddress> servers;  // index = rank
  std::vector<NodeAddress> workers;  // index = rank
  // Worker restart (pushpull launch --max-restarts, docs/ps.md "Worker
  // restart"): whether a worker's death waits for its replacement instead of
  // failing the job, and the receiver's incarnation (0: the original process;
  // n: the n-th replacement of its rank, which rejoins a running job).
  bool worker_restarts = false;
  // Whether every server and worker registered with the same host address
  // when the job formed (a replacement's book keeps it): workers then cut
  // values into fewer, bigger chunks, since a message between processes of
  // one host costs CPU, not link time (kvstore/dist_store.cpp).
  bool one_host = false;
  int32_t incarnation = 0;
  const NodeAddress& at(Role role, int rank) const;  // throws NotFound
};

// The id in Header::sender (transport/node_id.h: scheduler 1, server r 8+2r, worker r
// 9+2r, a server / worker without a rank 2 / 3). The Transport writes the
// authenticated peer's id into every delivered message.
uint32_t node_id(Role role, int rank);
// Inverse of node_id; {kNone, -1} for ids that name no node.
NodeAddress from_node_id(uint32_t id);

std::vector<std::byte> encode_register(const NodeAddress& me, int32_t preferred_rank);
Status decode_register(std::span<const std::byte> in, NodeAddress* me, int32_t* preferred_rank);
// Whether every server and worker of `book` has the same, known host (what
// the scheduler puts in AddressBook::one_host; the scheduler's own host
// does not count: it carries no tensors).
bool same_host(const AddressBook& book);

// The book as sent to the node of rank `your_rank` (compact: a table of the
// distinct hosts, 8 bytes a server or worker; every NodeAddress's rank is
// its position and its port and mesh_port must fit 16 bits). Only the
// leading rank differs between receivers: encode once and set_book_rank()
// a copy for each (the scheduler does, so sending the book costs a copy per
// node, not an encoding).
std::vector<std::byte> encode_book(int32_t your_rank, const AddressBook& book);
void set_book_rank(std::vector<std::byte>& encoded, int32_t your_rank);
Status decode_book(std::span<const std::byte> in, int32_t* your_rank, AddressBook* book);
// Parameter-server placement: which servers are gone. Epoch 0 is the job's
// start (no server dead); every fail-over increments it.
struct Placement {
  uint64_t epoch = 0;
  std::vector<bool> dead;  // index = server rank
  // Servers that rejoined after a fail-over (launch --max-restarts), by the
  // order of their rejoins (0: never rejoined; k: the job's k-th rejoin):
  // last in every chain, the later rejoin after the earlier, so a rejoin
  // never moves a primary (with a plain flag, two rejoined servers of one
  // chain fell back into home order: the second rejoin moved the primary and
  // stranded the round in flight, found by the chaos suite's survive mode).
  std::vector<uint32_t> late;
  // Dead servers whose restarted process registered and is catching up
  // (server rejoin): its connections are kept. A dead server without this
  // flag has no live process: a connection from it is stale, and a server
  // sending it ranges stops waiting for it (it died or was stopped while
  // catching up).
  std::vector<bool> restarting;
  bool is_dead(int s) const { return s >= 0 && static_cast<size_t>(s) < dead.size() && dead[s]; }
  bool is_restarting(int s) const {
    return s >= 0 && static_cast<size_t>(s) < restarting.size() && restarting[s];
  }
};

// Backups per key range a job uses: `configured` (PUSHPULL_PS_REPLICAS; -1 =
// the default, 1 when there are at least 2 servers), at most servers - 1.
int ps_replicas(int configured, int num_servers);

// The replica chain of a key range whose home (its server in the fault-free
// placement) is `home`: servers home, home+1, ..., home+replicas (mod S).
// `primary` is the first live one, `backups` the live ones after it; primary
// is -1 when every server of the chain is dead (the range is lost).
struct ReplicaChain {
  int primary = -1;
  std::vector<int> backups;
};
// Rejoined (`late`) live servers come after the others, in rejoin order.
ReplicaChain replica_chain(int home, int num_servers, int replicas, const std::vector<bool>& dead,
                           const std::vector<uint32_t>& late = {});

// The first home whose whole chain is dead, or -1 when every range has a
// live server.
int first_lost_home(int num_servers, int replicas, const std::vector<bool>& dead);

std::vector<std::byte> encode_placement(const Placement& p);
// Refuses malformed bytes and absurd server counts.
Status decode_placement(std::span<const std::byte> in, Placement* p);

std::vector<std::byte> encode_dead(const NodeAddress& who, const std::string& reason);
Status decode_dead(std::span<const std::byte> in, NodeAddress* who, std::string* reason);

}  // namespace pushpull::cluster
