// SPDX-License-Identifier: Apache-2.0
// Hierarchical allreduce: host reduce-scatter, cross-host allreduce, host
// allgather (see hierarchical.h), run over SubgroupTransport views of the
// group's transport.
#include "collective/hierarchical.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collective/hierarchical_view.h"

namespace pushpull::collective {

using transport::Block;
using transport::even_blocks;
using transport::Transport;

namespace {

// ctx's settings over another transport (and scratch).
AlgoContext over(const AlgoContext& ctx, Transport& t, std::vector<char>* scratch) {
  AlgoContext c{t};
  c.op_id = ctx.op_id;
  c.peer_timeout = ctx.peer_timeout;
  c.ring_segment_bytes = ctx.ring_segment_bytes;
  c.small_allreduce_bytes = ctx.small_allreduce_bytes;
  c.scratch = scratch;
  return c;
}

// Runs one phase; an error gets the phase and its (base) ranks appended, as
// the flat algorithms' messages number the ranks of the subgroup.
template <typename F>
void in_phase(const char* phase, const SubgroupTransport& t, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    Status(e.code(), fmt::format("{} [hierarchical allreduce: {} among ranks {}]", e.what(), phase,
                                 fmt::join(t.members(), ", ")))
        .raise();
  }
}

Status status_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return Status(err.code(), err.what());
  } catch (const std::exception& err) {
    return Status(ErrorCode::kInternal, err.what());
  }
}

// `count` elements of `chunk` split among the L ranks of a host, offsets
// relative to the whole vector.
std::vector<Block> host_blocks(const Block& chunk, int local_size) {
  auto blocks = even_blocks(chunk.count, local_size);
  for (auto& b : blocks)
    b.offset += chunk.offset;
  return blocks;
}

// What the two threads of the pipeline tell each other: how many chunks
// have been reduced inside the host, and how many have crossed the hosts.
// Both threads' waits on each other end: every phase has progress
// deadlines, and a failing thread sets `failed` (and aborts the transport).
struct Progress {
  std::mutex mu;
  std::condition_variable cv;
  size_t reduced = 0, crossed = 0;
  bool failed = false;
  std::exception_ptr first_error;

  void set(size_t Progress::*field, size_t value) {
    {
      std::lock_guard lk(mu);
      this->*field = value;
    }
    cv.notify_all();
  }
  // Until field > c; false when the other thread failed.
  bool wait_past(size_t Progress::*field, size_t c) {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return failed || this->*field > c; });
    return !failed;
  }
  // Records the first failure and ends every wait of the operation.
  void fail(std::exception_ptr e, Transport& t) {
    {
      std::lock_guard lk(mu);
      if (failed) return;
      failed = true;
      first_error = e;
    }
    cv.notify_all();
    t.abort(status_of(e));
  }
};

void sequential(AlgoContext& ctx, const Hierarchy& h, char* base, size_t count, DType dtype,
                ReduceOp op) {
  SubgroupTransport local(ctx.transport, h.local_members, true);
  SubgroupTransport cross(ctx.transport, h.cross_members, true);
  AlgoContext lctx = over(ctx, local, ctx.scratch), xctx = over(ctx, cross, ctx.scratch);
  const auto blocks = host_blocks(Block{0, count}, h.local_size);
  const Block& mine = blocks[static_cast<size_t>(h.local_rank)];
  const size_t esize = dtype_size(dtype);
  in_phase("host reduce-scatter", local, [&] { ring(lctx, base, dtype, op, blocks, true, false); });
  in_phase("cross-host allreduce", cross,
           [&] { allreduce(xctx, base + mine.offset * esize, mine.count, dtype, op); });
  in_phase("host allgather", local, [&] { ring(lctx, base, dtype, op, blocks, false, true); });
}

void pipelined(AlgoContext& ctx, const Hierarchy& h, char* base, size_t count, DType dtype,
               ReduceOp op, size_t nchunks) {
  // One phase at a time may run its schedules on the TCP transport's direct
  // streams (Transport::run; the other runs them posted). The host phases get
  // them when the host's pairs have them (loopback TCP: those phases move as
  // many bytes as the cross-host one, at memory speed, so they are the ones
  // that need the cheaper path; measured under load with the cross-host phase
  // on the streams instead, one 64 MiB run of four was 38% slower), else the cross-host
  // phase does (the host's pairs on shared memory).
  SubgroupTransport local(ctx.transport, h.local_members, true);
  SubgroupTransport cross(ctx.transport, h.cross_members, !local.direct());
  std::vector<char> local_scratch;
  AlgoContext lctx = over(ctx, local, &local_scratch), xctx = over(ctx, cross, ctx.scratch);
  const auto chunks = even_blocks(count, static_cast<int>(nchunks));
  const size_t esize = dtype_size(dtype);
  Progress p;
  std::thread helper([&] {
    try {
      // Every chunk's reduce-scatter first (the host is fast next to the
      // cross-host links), then each allgather as soon as its chunk crossed.
      for (size_t c = 0; c < nchunks; ++c) {
        in_phase("host reduce-scatter", local, [&] {
          ring(lctx, base, dtype, op, host_blocks(chunks[c], h.local_size), true, false);
        });
        p.set(&Progress::reduced, c + 1);
      }
      for (size_t c = 0; c < nchunks; ++c) {
        if (!p.wait_past(&Progress::crossed, c)) return;
        in_phase("host allgather", local, [&] {
          ring(lctx, base, dtype, op, host_blocks(chunks[c], h.local_size), false, true);
        });
      }
    } catch (...) {
      p.fail(std::current_exception(), ctx.transport);
    }
  });
  try {
    for (size_t c = 0; c < nchunks; ++c) {
      if (!p.wait_past(&Progress::reduced, c)) break;
      const Block mine = host_blocks(chunks[c], h.local_size)[static_cast<size_t>(h.local_rank)];
      in_phase("cross-host allreduce", cross,
               [&] { allreduce(xctx, base + mine.offset * esize, mine.count, dtype, op); });
      p.set(&Progress::crossed, c + 1);
    }
  } catch (...) {
    p.fail(std::current_exception(), ctx.transport);
  }
  helper.join();
  if (p.first_error) std::rethrow_exception(p.first_error);
}

}  // namespace

std::string Hierarchy::describe() const {
  return fmt::format("{} hosts x {} ranks", hosts, local_size);
}

std::vector<std::vector<int>> group_by_host(const std::vector<std::string>& host_of_rank) {
  std::vector<std::vector<int>> out;
  std::map<std::string, size_t> index;
  for (size_t r = 0; r < host_of_rank.size(); ++r) {
    auto [it, fresh] = index.emplace(host_of_rank[r], out.size());
    if (fresh) out.emplace_back();
    out[it->second].push_back(static_cast<int>(r));
  }
  return out;
}

std::optional<Hierarchy> choose_hierarchy(const std::vector<std::string>& host_of_rank, int rank,
                                          int mode, std::string* note) {
  auto say = [&](std::string why) {
    if (note) *note = std::move(why);
    return std::nullopt;
  };
  const int size = static_cast<int>(host_of_rank.size());
  if (mode == 0) return say("off (PUSHPULL_HIERARCHICAL_ALLREDUCE=0)");
  if (size < 2 || rank < 0 || rank >= size) return say("not used: the ranks' hosts are not known");
  const auto groups = group_by_host(host_of_rank);
  std::vector<size_t> counts;
  for (const auto& g : groups)
    counts.push_back(g.size());
  if (std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) != counts.end())
    return say(fmt::format(
        "not used: the hosts hold different numbers of ranks ({}); the flat ring runs instead",
        fmt::join(counts, ", ")));
  const int hosts = static_cast<int>(groups.size()), local = static_cast<int>(counts[0]);
  if (mode < 0 && (hosts < 2 || local < 2))
    return say(hosts < 2 ? "not used: every rank is on one host" : "not used: one rank per host");
  Hierarchy h;
  h.hosts = hosts;
  h.local_size = local;
  for (int g = 0; g < hosts; ++g) {
    const auto& ranks = groups[static_cast<size_t>(g)];
    auto at = std::find(ranks.begin(), ranks.end(), rank);
    if (at == ranks.end()) continue;
    h.host = g;
    h.local_rank = static_cast<int>(at - ranks.begin());
    h.local_members = ranks;
  }
  for (const auto& ranks : groups)
    h.cross_members.push_back(ranks[static_cast<size_t>(h.local_rank)]);
  if (note)
    *note = fmt::format("{} ({})", h.describe(),
                        mode > 0 ? "PUSHPULL_HIERARCHICAL_ALLREDUCE=1" : "automatic");
  return h;
}

void hierarchical_allreduce(AlgoContext& ctx, const Hierarchy& h, void* data, size_t count,
                            DType dtype, ReduceOp op) {
  if (ctx.size() == 1 || count == 0) return;
  if (h.hosts * h.local_size != ctx.size() ||
      h.local_members.size() != static_cast<size_t>(h.local_size) ||
      h.cross_members.size() != static_cast<size_t>(h.hosts) ||
      h.local_members[static_cast<size_t>(h.local_rank)] != ctx.rank())
    throw Internal(fmt::format("collective: hierarchy {} does not fit rank {} of a group of {}",
                               h.describe(), ctx.rank(), ctx.size()));
  const size_t bytes = count * dtype_size(dtype);
  char* base = static_cast<char*>(data);
  if (h.hosts >= 2 && h.local_size >= 2 && bytes >= kPipelineBytes)
    pipelined(ctx, h, base, count, dtype, op,
              std::clamp(bytes / kChunkBytes, size_t{2}, kMaxChunks));
  else
    sequential(ctx, h, base, count, dtype, op);
}

void allreduce_via(AlgoContext& ctx, const Hierarchy* h, void* data, size_t count, DType dtype,
                   ReduceOp op, double postscale) {
  if (!h) return allreduce(ctx, data, count, dtype, op, postscale);
  hierarchical_allreduce(ctx, *h, data, count, dtype, op);
  if (postscale != 1.0) scale(dtype, data, postscale, count);
}

}  // namespace pushpull::collective
