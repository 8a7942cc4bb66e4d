// SPDX-License-Identifier: Apache-2.0
// Where a launched job's nodes meet, and the ports the launcher holds for
// them until they are used (docs/security.md, "Ports are bound once and
// held until used").
//
// - the embedded scheduler binds its own port (launcher.cpp);
// - with -s 0 and the local launcher, rank 0's rendezvous port is bound here
//   and held (*listener): worker 0 inherits the listening socket;
// - MASTER_PORT for a torch.distributed store: torch binds it itself and
//   cannot adopt a socket (torch 1.13's TCPStore has no such option), so on
//   this host the port is held by a shared reservation
//   (transport::reserve_port_shared, *torch_store) for the job's life: torch's
//   store (which binds with SO_REUSEADDR) can listen on it, nobody who binds
//   without SO_REUSEADDR can take it first. Jobs with --hostfile: picked and
//   released (racy, transport::pick_unused_port), as worker 0's rendezvous port when
//   ssh, mpirun or srun starts worker 0.
//
// Thread safety: free functions; the Fds are the caller's.
#pragma once

#include <string>

#include "launch/plan.h"
#include "transport/socket.h"

namespace pushpull::launch {

// `listener`, `torch_store`: where the held sockets go (may be null with
// dry_run, which binds nothing).
Rendezvous choose_rendezvous(const LaunchConfig& cfg, bool dry_run, transport::Fd* listener,
                             transport::Fd* torch_store);

// A port for a torch.distributed store on `host` other than `avoid`: held in
// *torch_store when every process runs on this host (cfg.hosts empty) and
// torch_store is given, else picked and released.
int torch_store_port(const LaunchConfig& cfg, const std::string& host, int avoid,
                     transport::Fd* torch_store);

}  // namespace pushpull::launch
