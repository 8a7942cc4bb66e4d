// SPDX-License-Identifier: Apache-2.0
#include "launch/rendezvous_ports.h"

#include "transport/peer_policy.h"

namespace pushpull::launch {

int torch_store_port(const LaunchConfig& cfg, const std::string& host, int avoid,
                     transport::Fd* torch_store) {
  if (torch_store != nullptr && cfg.hosts.empty()) {
    // Bound now and held until the job ends; torch's store binds it beside
    // this reservation (both SO_REUSEADDR), nobody else can.
    for (int attempt = 0; attempt < 16; ++attempt) {
      transport::Fd held = transport::reserve_port_shared("", 0);
      const int port = transport::local_port(held.get());
      if (port == avoid) continue;
      *torch_store = std::move(held);
      return port;
    }
  }
  // Worker 0 may run on another host: picked and released (racy).
  int port = 0;
  do
    port = transport::pick_unused_port(cfg.hosts.empty() ? host : "0.0.0.0");
  while (port == avoid);
  return port;
}

// With -s 0 and the local launcher, rank 0's rendezvous port is bound here
// and held (*listener): worker 0 inherits the listening socket (run_launch),
// so no other program can take the port between its choice and its use.
Rendezvous choose_rendezvous(const LaunchConfig& cfg, bool dry_run, transport::Fd* listener,
                             transport::Fd* torch_store) {
  Rendezvous rv;
  if (cfg.nnodes > 0) {  // per-node mode: given
    rv = Rendezvous(cfg.master_addr, cfg.port);
    if (cfg.num_servers > 0) {  // node 0's scheduler has the port; a torch store the next one
      rv.master_addr = cfg.master_addr;
      rv.master_port = cfg.port + 1;
    }
    return rv;
  }
  if (cfg.num_servers > 0) {
    rv.addr = cfg.host_ip;
    rv.port = cfg.port;  // 0 until the scheduler has bound
    // MASTER_* for torch.distributed scripts: worker 0's host, a port other
    // than the scheduler's (checked again once the scheduler has bound).
    // The listener is torch's store, which cannot be handed a socket: held
    // by a shared reservation (torch_store_port); pushpull's own collectives
    // meet through the scheduler.
    auto hosts_of = place(cfg.hosts, cfg.num_servers, cfg.num_workers);
    rv.master_addr =
        cfg.hosts.empty() ? cfg.host_ip : cfg.hosts[hosts_of[size_t(cfg.num_servers)]].host;
    if (!dry_run) rv.master_port = torch_store_port(cfg, rv.master_addr, cfg.port, torch_store);
    return rv;
  }
  // No scheduler: worker 0 listens on the rendezvous port on its own host.
  auto hosts_of = place(cfg.hosts, 0, cfg.num_workers);
  rv.addr = cfg.hosts.empty() ? cfg.host_ip : cfg.hosts[hosts_of[0]].host;
  rv.port = cfg.port;
  if (dry_run) return rv;
  if (cfg.launcher == LauncherKind::kLocal) {
    // Worker 0 is our child: bind its port now (the one given, else any free
    // one; taken: "port P is in use (by another process)") and hand it the
    // listening socket. Bound where worker 0 itself would bind it.
    *listener = transport::listen_on(transport::bind_host_for(rv.addr, cfg.bind_any), cfg.port);
    rv.port = transport::local_port(listener->get());
    // A torch.distributed store cannot adopt that socket: MASTER_PORT is a
    // port of its own (held by a shared reservation), PUSHPULL_MASTER_PORT
    // the held listener's.
    rv.master_addr = rv.addr;
    rv.master_port = torch_store_port(cfg, rv.addr, rv.port, torch_store);
    return rv;
  }
  // Worker 0 is started by ssh, mpirun or srun, possibly on another host: the
  // launcher cannot hand it a socket. A port free here now, which worker 0
  // binds a moment later (racy, see docs/launch.md; --port chooses it).
  if (rv.port == 0) rv.port = transport::pick_unused_port(cfg.hosts.empty() ? rv.addr : "0.0.0.0");
  return rv;
}

}  // namespace pushpull::launch
