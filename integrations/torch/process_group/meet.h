// SPDX-License-Identifier: Apache-2.0
// How the ranks of a ProcessGroupPushpull find each other: through the
// c10d store torch.distributed already made (env://, tcp://, file://),
// wrapped as the group's collective::Store (src/collective/store.h, keys
// under "pushpull/"): every rank publishes its mesh listener there and rank
// 0 its verdict, then the mesh forms (no port of pushpull's own to reserve,
// no second rendezvous). Everything else comes from the environment (job
// secret and id, heartbeat and stall settings, fusion), so the mesh is
// authenticated and watched like every pushpull job.
//
// Blocking: up to ClusterOptions::startup_timeout. Errors: the Session's
// (InvalidArgument, Timeout naming the missing ranks, PeerFailure; the
// store failing, e.g. its host gone: PeerFailure).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "pushpull/collective.h"

namespace pushpull::torch_pg {

std::shared_ptr<collective::Session> meet(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                          int size);

}  // namespace pushpull::torch_pg
