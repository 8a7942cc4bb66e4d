// SPDX-License-Identifier: Apache-2.0
#include "collective/bootstrap.h"
#include "collective/shm_data_transport.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collective/elastic_client.h"
#include "collective/inprocess_transport.h"
#include "collective/rendezvous.h"
#include "collective/tcp_transport.h"
#include "net/address.h"
#include "pushpull/log.h"

namespace pushpull::collective {
namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

// The mesh's own NetOptions: connecting may take as long as startup.
NetOptions mesh_net(const Options& o) {
  NetOptions n = o.net;
  n.connect_timeout = o.cluster.startup_timeout;
  return n;
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

void set_local(const Options& o, const std::vector<std::pair<std::string, int>>& book, int rank,
               Bootstrapped* out) {
  std::vector<std::string> hosts;
  for (const auto& [h, p] : book)
    hosts.push_back(h);
  auto [lr, ls] = local_of(hosts, rank);
  out->local_rank = o.collective.local_rank >= 0 ? o.collective.local_rank : lr;
  out->local_size = o.collective.local_size >= 0 ? o.collective.local_size : ls;
}

namespace {

Bootstrapped from_cluster(const Options& o) {
  struct Ports {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int> port;  // by worker rank; 0 = not yet
    Status failure;
  };
  auto ports = std::make_shared<Ports>();
  ports->port.assign(static_cast<size_t>(std::max(o.cluster.num_workers, 0)), 0);
  Bootstrapped out;
  out.mode = BootstrapMode::kCluster;
  Options mesh = o;
  mesh.cluster.worker_mesh = true;  // the ports below travel worker to worker
  out.node = std::make_unique<cluster::Node>(mesh);
  // Runs on the Node's I/O thread: record the sender's mesh port.
  out.node->set_handler(kPortType, kPortType, [ports](net::Message&& m) {
    cluster::NodeAddress who = cluster::Node::sender(m.header);
    std::lock_guard lock(ports->mu);
    if (who.role != Role::kWorker || who.rank < 0 ||
        who.rank >= static_cast<int>(ports->port.size()) || m.header.key == 0 ||
        m.header.key > 65535) {
      PP_WARN("collective bootstrap: ignoring a port message from {}", who.describe());
      return;
    }
    ports->port[static_cast<size_t>(who.rank)] = static_cast<int>(m.header.key);
    ports->cv.notify_all();
  });
  out.node->on_peer_failure([ports](const Status& s) {
    std::lock_guard lock(ports->mu);
    if (ports->failure.is_ok()) ports->failure = s;
    ports->cv.notify_all();
  });
  auto deadline = Clock::now() + o.cluster.startup_timeout;
  out.node->start();
  const int rank = out.node->rank(), size = out.node->num_workers();
  const cluster::AddressBook& book = out.node->address_book();
  const std::string& my_host = book.workers.at(static_cast<size_t>(rank)).host;
  auto tcp = std::make_unique<TcpTransport>(rank, size, mesh_net(o),
                                            bind_host_for(my_host, o.net.bind_any), 0);
  const int my_port = tcp->port();
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    if (Status s = out.node->send_copy(
            Role::kWorker, r, net::Header{.type = kPortType, .key = static_cast<uint64_t>(my_port)},
            nullptr, 0);
        !s.is_ok())
      throw PeerFailure(
          fmt::format("collective bootstrap: worker {} cannot tell worker {} its "
                      "port: {}",
                      rank, r, s.message()));
  }
  {
    std::unique_lock lock(ports->mu);
    ports->port[static_cast<size_t>(rank)] = my_port;
    auto all = [&] {
      for (int p : ports->port)
        if (p == 0) return false;
      return true;
    };
    bool ok =
        ports->cv.wait_until(lock, deadline, [&] { return all() || !ports->failure.is_ok(); });
    ports->failure.raise();
    if (!ok) {
      std::vector<int> missing;
      for (int r = 0; r < size; ++r)
        if (ports->port[static_cast<size_t>(r)] == 0) missing.push_back(r);
      throw Timeout(
          fmt::format("collective bootstrap: worker {} got no collective port from "
                      "workers {} within {} ms",
                      rank, fmt::join(missing, ", "), o.cluster.startup_timeout.count()));
    }
    for (int r = 0; r < size; ++r)
      out.book.emplace_back(book.workers.at(static_cast<size_t>(r)).host,
                            ports->port[static_cast<size_t>(r)]);
  }
  tcp->connect_all(out.book);
  // The scheduler's verdicts (a node dead, the job aborted) fail the mesh's
  // operations with the name of the node that failed. The port outlives the
  // transport, so a late callback from the Node's threads is harmless.
  out.node->on_peer_failure([port = tcp->verdict_port()](const Status& s) { port->deliver(s); });
  if (Status f = out.node->failure(); !f.is_ok()) tcp->declare(f);
  LivenessConfig live = mesh_liveness(o, true);
  for (const auto& w : book.workers)
    live.names.push_back(w.describe());
  tcp->start_liveness(std::move(live));
  set_local(o, out.book, rank, &out);
  out.mesh = tcp.get();
  // Ranks of one host: data through shared memory (PUSHPULL_SHM=0: TCP).
  out.transport =
      use_shared_memory(std::move(tcp), o.collective, o.cluster.startup_timeout, "/dev/shm");
  return out;
}

Bootstrapped from_rendezvous(const Options& o) {
  const CollectiveOptions& c = o.collective;
  RendezvousConfig rc;
  rc.net = o.net;
  rc.rank = c.rank;
  rc.size = c.size;
  rc.master_addr = c.master_addr;
  rc.master_port = c.master_port;
  rc.timeout = o.cluster.startup_timeout;
  // A loopback rendezvous means every rank is on this host: stay on loopback.
  if (!o.net.node_host.empty())
    rc.host = o.net.node_host;
  else if (is_loopback(c.master_addr))
    rc.host = "127.0.0.1";
  else
    rc.host = net::choose_host(o.net, c.master_addr);  // the route to rank 0
  auto tcp = std::make_unique<TcpTransport>(c.rank, c.size, mesh_net(o),
                                            bind_host_for(rc.host, o.net.bind_any), 0);
  rc.port = tcp->port();
  Bootstrapped out;
  out.mode = BootstrapMode::kRendezvous;
  out.book = rendezvous(rc);
  tcp->connect_all(out.book);
  tcp->start_liveness(mesh_liveness(o, false));
  set_local(o, out.book, c.rank, &out);
  out.mesh = tcp.get();
  // Ranks of one host: data through shared memory (PUSHPULL_SHM=0: TCP).
  out.transport =
      use_shared_memory(std::move(tcp), o.collective, o.cluster.startup_timeout, "/dev/shm");
  return out;
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
      return from_rendezvous(options);
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

}  // namespace pushpull::collective
