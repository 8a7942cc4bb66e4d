// SPDX-License-Identifier: Apache-2.0
// How the ranks of a ProcessGroupPushpull find each other: through the
// c10d store torch.distributed already made (env://, tcp://, file://).
//
// MASTER_PORT belongs to torch's TCPStore, so pushpull's rendezvous needs a
// port of its own: rank 0 reserves a free one (a bound, non-listening socket
// with SO_REUSEADDR, held until its Session listens there, so no other
// program is handed that port meanwhile) and publishes "host port" under
// kRendezvousKey; the others wait for the key (at most the startup
// timeout). Then every rank builds a Session in rendezvous mode with the
// group's rank and size; everything else comes from the environment (job
// secret and id, heartbeat and stall settings, fusion), so the mesh is
// authenticated and watched like every pushpull job. Rank 0 deletes the key
// once every rank has joined.
//
// Blocking: up to ClusterOptions::startup_timeout. Errors: Timeout (rank 0
// never published), or the Session's (InvalidArgument, Timeout naming the
// missing ranks, PeerFailure).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "pushpull/collective.h"

namespace pushpull::torch_pg {

inline constexpr const char* kRendezvousKey = "pushpull/rendezvous";

std::shared_ptr<collective::Session> meet(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                          int size);

}  // namespace pushpull::torch_pg
