// SPDX-License-Identifier: Apache-2.0
// Bootstrap: builds this process's collective Transport (a TcpTransport
// connecting the algorithms' partners, tcp_transport_mesh.cpp, and any other
// pair on first use; collective data between ranks of one host
// through shared memory unless PUSHPULL_SHM=0, shm_data_transport.h) from the Options of a job,
// however it was started. Used by collective::Session (include/pushpull/collective.h) and so by the
// free functions and the dist_sync_allreduce KVStore.
//
// Modes, in the order they are tried (bootstrap_mode()):
// - kCluster: a pushpull job with a scheduler (DMLC_ROLE=worker and
//   DMLC_NUM_SERVER >= 1). A cluster::Node registers with the scheduler; its
//   worker ranks and address book are the group. The collective mesh is a
//   TcpTransport of its own (the Node's connections carry typed messages that
//   TcpTransport cannot share): each worker listens on a fresh port before it
//   registers and tells the scheduler that port with its registration
//   (ClusterOptions::mesh_port); the address book hands every worker's to
//   every worker (NodeAddress::mesh_port), and the mesh is connected from it.
//   Workers open no connections to each other for this.
// - kRendezvous: no scheduler, but a rank and a world size (torchrun's RANK /
//   WORLD_SIZE, mpirun's OMPI_COMM_WORLD_RANK / _SIZE, Slurm's SLURM_PROCID /
//   SLURM_NTASKS, `pushpull launch -s 0`) and, for size > 1, a rendezvous
//   address MASTER_ADDR / MASTER_PORT (or PUSHPULL_MASTER_ADDR / _PORT)
//   where rank 0 hosts the group's Store (tcp_store.h; torch's backend
//   passes its c10d store instead). The ranks trade their mesh listeners
//   through it (store.h), then connect the mesh (the higher rank connects
//   to the lower).
// - kSingle: nothing of the above set: a world of one (a script run alone).
//
// Message types (net's collective range 128..191): 128 is TcpTransport's
// data; 129 unused (the port exchange before mesh_port), 130..132 the
// MASTER_ADDR store's (tcp_store.h); 133..135 the mesh's failure detector
// (heartbeat, verdict, goodbye; see tcp_transport.h), started here once the
// mesh is connected.
//
// local_rank / local_size: from the environment (LOCAL_RANK, ...) when set,
// else counted among the ranks whose advertised host equals this one's.
//
// Deadlines and failures: every wait is bounded by
// ClusterOptions::startup_timeout (PUSHPULL_STARTUP_TIMEOUT_MS or the
// launcher's --timeout): a rank that never shows up is a Timeout naming the
// missing ranks and the address; a rank whose connection closes during the
// rendezvous (it died) is a PeerFailure naming it, on rank 0 and, through
// rank 0's verdict, on every other rank.
//
// Thread safety: bootstrap() blocks the calling thread (no other threads of
// the caller are involved). Ownership: the result owns what it made.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cluster/node.h"
#include "pushpull/options.h"
#include "transport/transport.h"

namespace pushpull::transport {
class TcpTransport;
class Transport;
struct LivenessConfig;
}  // namespace pushpull::transport

namespace pushpull::collective {
class Store;
using transport::LivenessConfig;
using transport::TcpTransport;
using transport::Transport;
}  // namespace pushpull::collective

namespace pushpull::collective {

// kElastic: a worker of `pushpull launch --min-workers/--max-workers`
// (PUSHPULL_ELASTIC_ADDR set): the launcher's rendezvous places it in a round
// (elastic_client.h).
enum class BootstrapMode { kSingle, kCluster, kRendezvous, kElastic };
// "single", "cluster", "rendezvous", "elastic"
std::string_view bootstrap_mode_name(BootstrapMode m);

struct Bootstrapped {
  BootstrapMode mode = BootstrapMode::kSingle;
  std::unique_ptr<Transport> transport;
  int local_rank = 0;
  int local_size = 1;
  // kCluster only: this worker's Node (owned; shut it down in order at the
  // end so the scheduler sees the worker leave).
  std::unique_ptr<cluster::Node> node;
  // The TCP mesh inside `transport`, or null when there is none (a world
  // of one).
  TcpTransport* mesh = nullptr;
  // The mesh's failure detector's verdict (the job's first failure), once
  // decided; empty when there is no mesh. Valid while `transport` lives.
  std::function<std::optional<Status>()> verdict;
  // Every rank's (host, port) of the collective mesh.
  std::vector<std::pair<std::string, int>> book;
};

// Which mode `options` selects; InvalidArgument when the settings are
// inconsistent (a rank without a size, rank >= size, size > 1 without a
// rendezvous address), saying which variables to set.
BootstrapMode bootstrap_mode(const Options& options);

// Builds the transport. Blocks up to options.cluster.startup_timeout.
Bootstrapped bootstrap(const Options& options);
// kRendezvous through `store` (torch's c10d store) instead of MASTER_ADDR's:
// options.collective's rank and size (> 1) are the group's.
Bootstrapped bootstrap(const Options& options, Store& store);

// The pieces every mode shares (elastic_client.cpp builds its mesh with them):
// the mesh's NetOptions (connecting may take as long as startup) and its
// failure detector settings.
NetOptions mesh_net(const Options& o);
// The host a rank's mesh listener advertises: PUSHPULL_NODE_HOST, else
// loopback when `toward` (who it meets first) is, else the route there.
std::string mesh_host(const Options& o, const std::string& toward);
LivenessConfig mesh_liveness(const Options& o, bool cluster);

// The one way a group forms once its address book is known, whatever
// produced the book (the scheduler, a Store: MASTER_ADDR's or torch's c10d
// store, or an elastic round): connects `tcp`'s mesh from
// `book`, starts its failure detector with `liveness`, takes local_rank /
// local_size from `o` (when set) or counts them in the book, and puts shared
// memory under the host's ranks (PUSHPULL_SHM=0: TCP only), its exchanges
// bounded by `shm_timeout`. Hook the mesh's verdicts (verdict_port) to the
// mode's failure source before calling: a failure while connecting then
// names its culprit. Throws what connecting and the shared-memory setup
// throw (Timeout, PeerFailure, ...).
Bootstrapped connect_group(BootstrapMode mode, std::unique_ptr<TcpTransport> tcp,
                           std::vector<std::pair<std::string, int>> book, LivenessConfig liveness,
                           const Options& o, Millis shm_timeout);

// Counts local_rank / local_size among the ranks of `hosts` with hosts[rank]'s value.
std::pair<int, int> local_of(const std::vector<std::string>& hosts, int rank);

}  // namespace pushpull::collective
