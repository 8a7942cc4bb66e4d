// SPDX-License-Identifier: Apache-2.0
// Hierarchical allreduce for groups with several ranks per host (Horovod's
// HOROVOD_HIERARCHICAL_ALLREDUCE): H hosts with L ranks each.
//
//   1. Inside each host, a ring reduce-scatter among its L ranks over the
//      local transport (shared memory when the transport has it, else
//      loopback TCP): local rank j ends with block j (1/L of the vector)
//      summed over the host.
//   2. Between hosts, local rank j allreduces its block with the j-th rank
//      of every other host (ring, or halving-doubling when small). The L
//      cross-host groups run at once, so every rank of a host uses its
//      host's link and each host link carries 2(H-1)/H of the vector, where
//      the flat ring sends 2(n-1)/n of it over its host-crossing hops.
//   3. Inside each host, a ring allgather of the L blocks.
//
// Large vectors (>= kPipelineBytes) are cut into chunks that move through
// the phases as a pipeline: a helper thread runs the host's phases (1 and 3)
// of chunk c+1 and c-1 while the calling thread runs phase 2 of chunk c, so
// only the first chunk's reduce-scatter and the last chunk's allgather add
// to the cross-host time. Each phase builds Schedules (ring.cpp,
// halving_doubling.cpp) and runs them on a SubgroupTransport
// (hierarchical_view.h); only one thread may drive the TCP transport's
// direct streams (Transport::run): the host phases when the host's pairs
// have them, else the cross-host phase; the other phase's schedules run
// with post_send/post_recv (run_posted, schedule.h).
//
// Every element is reduced in one place, so all ranks get identical results.
// Errors: as the flat algorithms (thrown, every wait with a deadline), with
// the phase and its ranks added to the message; a failure in the pipeline
// aborts the transport with it (what the engine does with any algorithm
// error), so the other thread's waits end at once.
//
// Thread safety: a Hierarchy is immutable; hierarchical_allreduce is called
// by one thread per rank (the engine's), as the flat algorithms are.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "collective/algorithms.h"

namespace pushpull::collective {

// From this many bytes the phases run as a pipeline of chunks of at least
// kChunkBytes (at most kMaxChunks chunks). Measured on 2 namespace hosts x 2
// ranks at 1 Gbit/s: 8 MiB / 4 MiB chunks left 4-16 MiB vectors 8-13% above
// the bound, these 2-5% (docs/performance.md).
inline constexpr size_t kPipelineBytes = size_t{2} << 20;
inline constexpr size_t kChunkBytes = size_t{1} << 20;
inline constexpr size_t kMaxChunks = 16;

// This rank's place in a group of hosts.
struct Hierarchy {
  int hosts = 1;                   // H
  int local_size = 1;              // L, the same on every host
  int host = 0;                    // this rank's host, 0..H-1 (hosts ordered by their lowest rank)
  int local_rank = 0;              // this rank's index among its host's ranks (ascending)
  std::vector<int> local_members;  // the ranks of this host, ascending
  std::vector<int> cross_members;  // the local_rank-th rank of every host, by host
  // "2 hosts x 2 ranks"
  std::string describe() const;
};

// The ranks of each host: equal identities are one host; hosts in the order
// of their lowest rank, ranks ascending.
std::vector<std::vector<int>> group_by_host(const std::vector<std::string>& host_of_rank);

// The hierarchy `rank` uses for allreduce, or nullopt for the flat
// algorithms. `mode`: -1 automatic (>= 2 hosts, >= 2 ranks on a host, the
// same number on every host), 0 never, 1 whenever the ranks per host are
// uniform (for testing; 1 rank per host or 1 host degenerates to the flat
// ring). `host_of_rank` empty or of another size than the group: nullopt.
// `note` (optional) gets why it was or was not chosen, for a log line.
std::optional<Hierarchy> choose_hierarchy(const std::vector<std::string>& host_of_rank, int rank,
                                          int mode, std::string* note = nullptr);

// In place: data (count elements) becomes the reduction over all ranks,
// through `h` (which every rank computed from the same host list).
void hierarchical_allreduce(AlgoContext& ctx, const Hierarchy& h, void* data, size_t count,
                            DType dtype, ReduceOp op);

// hierarchical_allreduce when `h` is set, else allreduce (algorithms.h);
// then times `postscale`.
void allreduce_via(AlgoContext& ctx, const Hierarchy* h, void* data, size_t count, DType dtype,
                   ReduceOp op, double postscale = 1.0);

}  // namespace pushpull::collective
