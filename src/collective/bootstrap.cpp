// SPDX-License-Identifier: Apache-2.0
#include "collective/bootstrap.h"
#include "transport/shm/shm_data_transport.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collective/elastic_client.h"
#include "collective/store.h"
#include "collective/tcp_store.h"
#include "pushpull/log.h"
#include "transport/address.h"
#include "transport/inproc/inprocess_transport.h"
#include "transport/peer_policy.h"
#include "transport/socket.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::collective {

using transport::Clock;
using transport::InProcessFabric;
using transport::LivenessConfig;
using transport::TcpTransport;
using transport::use_shared_memory;

// The mesh's own NetOptions: connecting may take as long as startup.
NetOptions mesh_net(const Options& o) {
  NetOptions n = o.net;
  n.connect_timeout = o.cluster.startup_timeout;
  return n;
}

// A loopback meeting point means every rank is on this host: stay on loopback.
std::string mesh_host(const Options& o, const std::string& toward) {
  if (!o.net.node_host.empty()) return o.net.node_host;
  return transport::is_loopback_host(toward) ? "127.0.0.1" : transport::choose_host(o.net, toward);
}

// The mesh's failure detector (tcp_transport.h): heartbeats at
// min(heartbeat_interval, heartbeat_timeout / 5). In a cluster the scheduler
// is the main detector (its verdict reaches the mesh through the Node), so
// the mesh's own limit is an interval + 0.5 s longer and a closed connection waits
// longer than the Node's own grace for the scheduler's word.
LivenessConfig mesh_liveness(const Options& o, bool cluster) {
  const auto& c = o.cluster;
  LivenessConfig l;
  l.heartbeat_interval =
      std::max(Millis{10}, std::min(c.heartbeat_interval, c.heartbeat_timeout / 5));
  l.heartbeat_timeout = c.heartbeat_timeout;
  l.grace = std::min(c.heartbeat_timeout / 2, Millis{1500});
  if (cluster) {
    l.noun = "worker";
    l.heartbeat_timeout += c.heartbeat_interval + Millis{500};
    l.grace =
        std::min(c.heartbeat_timeout / 2, 2 * c.heartbeat_interval + Millis{500}) + Millis{1000};
  }
  return l;
}

Bootstrapped connect_group(BootstrapMode mode, std::unique_ptr<TcpTransport> tcp,
                           std::vector<std::pair<std::string, int>> book, LivenessConfig liveness,
                           const Options& o, Millis shm_timeout) {
  Bootstrapped out;
  out.mode = mode;
  out.book = std::move(book);
  tcp->connect_all(out.book);
  tcp->start_liveness(std::move(liveness));
  std::vector<std::string> hosts;
  for (const auto& [h, p] : out.book)
    hosts.push_back(h);
  auto [lr, ls] = local_of(hosts, tcp->rank());
  out.local_rank = o.collective.local_rank >= 0 ? o.collective.local_rank : lr;
  out.local_size = o.collective.local_size >= 0 ? o.collective.local_size : ls;
  out.mesh = tcp.get();
  out.verdict = [mesh = out.mesh] { return mesh->verdict(); };
  out.transport = use_shared_memory(std::move(tcp), o.collective, shm_timeout, "/dev/shm");
  return out;
}

namespace {

Bootstrapped from_cluster(const Options& o) {
  // The mesh's listener, bound (and held) before registering: its port
  // travels in the registration and reaches every worker in the scheduler's
  // address book (NodeAddress::mesh_port), so no worker dials another just
  // to trade ports. The host is the one the Node advertises.
  const std::string host = transport::choose_host(o.net, o.cluster.root_uri);
  const std::string bind_host = transport::bind_host_for(host, o.net.bind_any);
  transport::Fd listener = transport::listen_on(bind_host, 0);
  Options registered = o;
  registered.cluster.mesh_port = transport::local_port(listener.get());
  auto node = std::make_unique<cluster::Node>(registered);
  node->start();
  const cluster::AddressBook& book = node->address_book();
  std::vector<std::pair<std::string, int>> mesh_book;
  LivenessConfig live = mesh_liveness(o, true);
  for (const auto& w : book.workers) {
    if (w.mesh_port <= 0)
      throw ProtocolError(fmt::format(
          "collective bootstrap: {} registered no collectives port; every worker of a job "
          "must run the same pushpull version",
          w.describe()));
    mesh_book.emplace_back(w.host, w.mesh_port);
    live.names.push_back(w.describe());
  }
  auto tcp = std::make_unique<TcpTransport>(node->rank(), node->num_workers(), mesh_net(o),
                                            bind_host, std::move(listener));
  // The scheduler's verdicts (a node dead, the job aborted) fail the mesh's
  // operations with the name of the node that failed. The port outlives the
  // transport, so a late callback from the Node's threads is harmless.
  node->on_peer_failure([port = tcp->verdict_port()](const Status& s) { port->deliver(s); });
  if (Status f = node->failure(); !f.is_ok()) tcp->declare(f);
  Bootstrapped out = connect_group(BootstrapMode::kCluster, std::move(tcp), std::move(mesh_book),
                                   std::move(live), o, o.cluster.startup_timeout);
  out.node = std::move(node);
  return out;
}

// The group meets through `store`, or, when null, the MASTER_ADDR store.
Bootstrapped from_store(const Options& o, Store* store) {
  const CollectiveOptions& c = o.collective;
  const auto deadline = Clock::now() + o.cluster.startup_timeout;
  const std::string host = mesh_host(o, c.master_addr);
  auto tcp = std::make_unique<TcpTransport>(c.rank, c.size, mesh_net(o),
                                            transport::bind_host_for(host, o.net.bind_any), 0);
  AddressList book;
  if (store != nullptr) {
    book = exchange_book(*store, c.rank, c.size, host, tcp->port(), deadline);
  } else {  // gone before the mesh connects: rank 0's lingers until all read the book
    TcpStore own(o, deadline);
    book = exchange_book(own, c.rank, c.size, host, tcp->port(), deadline);
  }
  return connect_group(BootstrapMode::kRendezvous, std::move(tcp), std::move(book),
                       mesh_liveness(o, false), o, o.cluster.startup_timeout);
}

}  // namespace

std::string_view bootstrap_mode_name(BootstrapMode m) {
  switch (m) {
    case BootstrapMode::kSingle:
      return "single";
    case BootstrapMode::kCluster:
      return "cluster";
    case BootstrapMode::kRendezvous:
      return "rendezvous";
    case BootstrapMode::kElastic:
      return "elastic";
  }
  return "invalid";
}

std::pair<int, int> local_of(const std::vector<std::string>& hosts, int rank) {
  int lr = 0, ls = 0;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    if (hosts[static_cast<size_t>(r)] != hosts[static_cast<size_t>(rank)]) continue;
    if (r < rank) ++lr;
    ++ls;
  }
  return {lr, ls};
}

BootstrapMode bootstrap_mode(const Options& o) {
  const auto role = o.cluster.role;
  if (role == Role::kServer || role == Role::kScheduler)
    throw InvalidArgument(fmt::format(
        "collectives run among the workers; this process is a {} (DMLC_ROLE)", role_name(role)));
  if (elastic::client_config_from_env(o)) return BootstrapMode::kElastic;
  if (role == Role::kWorker && o.cluster.num_servers >= 1) return BootstrapMode::kCluster;
  const CollectiveOptions& c = o.collective;
  if (c.rank < 0 && c.size < 0) {
    if (role == Role::kWorker && o.cluster.num_workers > 1)
      throw InvalidArgument(
          "collective bootstrap: this worker of a job without servers has no RANK / WORLD_SIZE; "
          "start it with `pushpull launch -s 0`, or set RANK, WORLD_SIZE, MASTER_ADDR and "
          "MASTER_PORT");
    return BootstrapMode::kSingle;
  }
  if (c.size < 1 || c.rank < 0 || c.rank >= c.size)
    throw InvalidArgument(fmt::format(
        "collective bootstrap: rank {} of world size {} is not a valid place; set RANK (or "
        "OMPI_COMM_WORLD_RANK / SLURM_PROCID) to 0..WORLD_SIZE-1 and WORLD_SIZE (or "
        "OMPI_COMM_WORLD_SIZE / SLURM_NTASKS) to the number of processes",
        c.rank, c.size));
  if (c.size == 1) return BootstrapMode::kSingle;
  if (c.master_addr.empty() || c.master_port <= 0)
    throw InvalidArgument(fmt::format(
        "collective bootstrap: rank {} of {} needs a rendezvous address; set MASTER_ADDR and "
        "MASTER_PORT (or PUSHPULL_MASTER_ADDR / PUSHPULL_MASTER_PORT) to rank 0's host and a free "
        "port, the same for every process (mpirun: -x MASTER_ADDR -x MASTER_PORT)",
        c.rank, c.size));
  return BootstrapMode::kRendezvous;
}

Bootstrapped bootstrap(const Options& options) {
  switch (bootstrap_mode(options)) {
    case BootstrapMode::kCluster:
      return from_cluster(options);
    case BootstrapMode::kRendezvous:
      return from_store(options, nullptr);
    case BootstrapMode::kElastic:
      return elastic::bootstrap_elastic(options);
    case BootstrapMode::kSingle:
      break;
  }
  Bootstrapped out;
  InProcessFabric fabric(1);
  out.transport = fabric.endpoint(0);
  out.book = {{"127.0.0.1", 0}};
  out.local_rank = 0;
  out.local_size = 1;
  return out;
}

Bootstrapped bootstrap(const Options& options, Store& store) {
  const CollectiveOptions& c = options.collective;
  if (c.size < 2 || c.rank < 0 || c.rank >= c.size)
    throw InvalidArgument(
        fmt::format("collective bootstrap: rank {} of world size {} cannot meet through a store",
                    c.rank, c.size));
  return from_store(options, &store);
}

}  // namespace pushpull::collective
