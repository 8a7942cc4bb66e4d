// SPDX-License-Identifier: Apache-2.0
// Executing the responses rank 0 agreed on: every rank runs the same list in
// the same order, numbering the ops identically (next_op_id_), and a rank that
// has joined takes part with the identity (or no rows) in place of data.
#include <cstring>

#include <fmt/format.h>

#include "base/flight_recorder.h"
#include "base/metrics.h"
#include "base/timeline.h"
#include "collective/engine.h"
#include "pushpull/kernels.h"

namespace pushpull::collective {

using transport::Block;
using transport::even_blocks;

namespace {

ReduceOp kernel_op(Reduction r) {
  switch (r) {
    case Reduction::kSum:
    case Reduction::kAverage:
      return ReduceOp::kSum;
    case Reduction::kMin:
      return ReduceOp::kMin;
    case Reduction::kMax:
      return ReduceOp::kMax;
    case Reduction::kProduct:
      return ReduceOp::kProd;
  }
  return ReduceOp::kSum;
}

int64_t rows_of(const Shape& s) {
  return s.ndim() == 0 ? 1 : s[0];
}

// Elements per row: the product of all but the first dimension.
int64_t row_elems_of(const Shape& s) {
  int64_t e = 1;
  for (int i = 1; i < s.ndim(); ++i)
    e *= s[i];
  return e;
}

// The shape with the first dimension replaced by `rows` (a scalar becomes 1-D).
Shape with_rows(const Shape& s, int64_t rows) {
  std::vector<int64_t> dims(s.dims().begin(), s.dims().end());
  if (dims.empty()) dims.push_back(rows);
  dims[0] = rows;
  return Shape(std::span<const int64_t>(dims));
}

// even_blocks over the members of spec's process set (every rank when it
// has none); the other ranks get empty blocks.
std::vector<Block> member_blocks(const Spec& spec, size_t rows, int size) {
  if (spec.members.empty()) return even_blocks(rows, size);
  auto parts = even_blocks(rows, static_cast<int>(spec.members.size()));
  std::vector<Block> blocks(static_cast<size_t>(size));
  size_t next = 0, offset = 0;
  for (int r = 0; r < size; ++r) {
    if (next < spec.members.size() && spec.members[next] == r) {
      blocks[static_cast<size_t>(r)] = parts[next++];
      offset = blocks[static_cast<size_t>(r)].offset + blocks[static_cast<size_t>(r)].count;
    } else {
      blocks[static_cast<size_t>(r)] = Block{offset, 0};
    }
  }
  return blocks;
}

}  // namespace

Communicator::Impl::LocalOp* Communicator::Impl::find(const std::string& name) {
  auto it = local_.find(name);
  return it == local_.end() ? nullptr : &it->second;
}

void Communicator::Impl::finish(const std::string& name, Status st, Array output) {
  PP_TIMELINE_END(fmt::format("rank {}", rank_), name);    // timeline hook
  PP_METRIC_ADD(kCollectiveOps, 1);                        // metrics hook
  if (!st.is_ok()) PP_METRIC_ADD(kCollectiveFailures, 1);  // metrics hook
  auto it = local_.find(name);
  if (it == local_.end()) return;
  auto h = it->second.handle;
  local_.erase(it);
  {
    // Free the name before completing, so a waiter may reuse it at once.
    std::lock_guard lock(mu_);
    active_names_.erase(name);
  }
  h->output = std::move(output);
  h->complete(std::move(st));
}

void Communicator::Impl::execute(std::vector<Response>& rs) {
  for (auto& r : rs) {
    for (auto& t : r.tensors) {
      if (r.kind != Response::Kind::kExecute) continue;
      if (t.has_spec) {
        if (rank_ != 0 && t.cache_id != kNoCacheId) cache_.record(t.cache_id, t.spec);
      } else {
        const Spec* s = cache_.get(t.cache_id);
        if (!s)
          throw ProtocolError(
              fmt::format("collective: response names unknown cache id {}", t.cache_id));
        t.spec = *s;
      }
    }
    for (const auto& t : r.tensors)  // flight recorder: this rank's tensors start executing
      if (LocalOp* op = find(t.name)) flight::update(op->handle->flight, flight::State::kStarted);
    for (const auto& t : r.tensors)  // timeline hook: this rank's tensors start executing
      if (timeline::enabled() && find(t.name))
        PP_TIMELINE_PHASE(fmt::format("rank {}", rank_), t.name,
                          r.kind == Response::Kind::kError ? "ERROR" : op_type_name(t.spec.type),
                          t.spec.bytes());
    if (metrics::enabled())  // metrics hook
      for (const auto& t : r.tensors)
        PP_METRIC_ADD(kCollectiveBytes, t.spec.bytes());
    execute_one(r);
  }
}

void Communicator::Impl::execute_one(Response& r) {
  if (r.kind == Response::Kind::kError) {
    for (const auto& t : r.tensors)
      finish(t.name, Status(r.code, r.message));
    return;
  }
  if (r.kind == Response::Kind::kJoinDone) {
    std::shared_ptr<detail::HandleState> h;
    {
      std::lock_guard lock(mu_);
      h = std::move(join_handle_);
      join_handle_.reset();
    }
    if (h) {
      {
        std::lock_guard lock(h->mu);
        h->value = r.joined.empty() ? -1 : r.joined[0];
      }
      h->complete(Status::ok());
    }
    return;
  }
  if (r.tensors.empty()) throw ProtocolError("collective: response without tensors");
  AlgoContext ctx{*transport_};
  ctx.op_id = next_op_id_++;
  ctx.peer_timeout = opts_.peer_timeout;
  ctx.ring_segment_bytes = opts_.collective.ring_segment_bytes;
  ctx.small_allreduce_bytes = opts_.collective.small_allreduce_bytes;
  ctx.scratch = &scratch_;
  const Spec& spec = r.tensors[0].spec;
  switch (spec.type) {
    case OpType::kAllreduce: {
      std::vector<Spec> specs;
      for (const auto& t : r.tensors)
        specs.push_back(t.spec);
      run_allreduce(r, specs, ctx);
      return;
    }
    case OpType::kBroadcast: {
      LocalOp* op = find(spec.name);
      void* buf = op ? op->output.data : nullptr;
      if (!op) {
        fusion_.resize(spec.bytes());
        buf = fusion_.data();
      }
      collective::broadcast(ctx, buf, spec.bytes(), spec.root);
      finish(spec.name, Status::ok());
      return;
    }
    case OpType::kAllgather:
      run_allgather(r, spec, ctx);
      return;
    case OpType::kReduceScatter:
      run_reduce_scatter(r, spec, ctx);
      return;
    case OpType::kBarrier:
      collective::barrier(ctx);
      finish(spec.name, Status::ok());
      return;
  }
}

void Communicator::Impl::run_allreduce(const Response& r, const std::vector<Spec>& specs,
                                       AlgoContext& ctx) {
  const DType dtype = specs[0].dtype;
  const ReduceOp kop = kernel_op(specs[0].reduction);
  const int contributors = size_ - static_cast<int>(r.joined.size());
  // Fused ops share their postscale (the coordinator fuses only those).
  const double alpha =
      (specs[0].reduction == Reduction::kAverage ? 1.0 / contributors : 1.0) * specs[0].postscale;
  LocalOp* single = specs.size() == 1 ? find(specs[0].name) : nullptr;
  if (single) {
    // Zero-copy: reduce straight in the caller's output buffer.
    const size_t count = static_cast<size_t>(specs[0].shape.numel());
    if (single->output.data != single->input.data && count)
      std::memcpy(single->output.data, single->input.data, specs[0].bytes());
    allreduce_via(ctx, hierarchy_ ? &*hierarchy_ : nullptr, single->output.data, count, dtype, kop,
                  alpha);
    finish(specs[0].name, Status::ok());
    return;
  }
  // Fused (or a joined rank's identity): pack, reduce once, unpack.
  size_t total = 0;
  for (const auto& s : specs)
    total += s.bytes();
  if (fusion_.size() < total) fusion_.resize(total);
  PP_TIMELINE_PHASE(fmt::format("rank {}", rank_), "fusion buffer", "MEMCPY_IN_FUSION_BUFFER",
                    total);  // timeline hook
  size_t off = 0;
  for (const auto& s : specs) {
    LocalOp* op = find(s.name);
    if (op)
      std::memcpy(fusion_.data() + off, op->input.data, s.bytes());
    else
      fill_identity(kop, dtype, fusion_.data() + off, static_cast<size_t>(s.shape.numel()));
    off += s.bytes();
  }
  const size_t count = total / dtype_size(dtype);
  PP_TIMELINE_PHASE(fmt::format("rank {}", rank_), "fusion buffer", "ALLREDUCE",
                    total);  // timeline hook
  allreduce_via(ctx, hierarchy_ ? &*hierarchy_ : nullptr, fusion_.data(), count, dtype, kop, alpha);
  PP_TIMELINE_PHASE(fmt::format("rank {}", rank_), "fusion buffer", "MEMCPY_OUT_FUSION_BUFFER",
                    total);  // timeline hook
  off = 0;
  for (const auto& s : specs) {
    if (LocalOp* op = find(s.name)) {
      if (s.bytes()) std::memcpy(op->output.data, fusion_.data() + off, s.bytes());
      finish(s.name, Status::ok());
    }
    off += s.bytes();
  }
  PP_TIMELINE_END(fmt::format("rank {}", rank_), "fusion buffer");  // timeline hook
}

void Communicator::Impl::run_allgather(const Response& r, const Spec& spec, AlgoContext& ctx) {
  if (r.rows.size() != static_cast<size_t>(size_))
    throw ProtocolError("collective: allgather response without every rank's rows");
  LocalOp* op = find(spec.name);
  const int64_t row_elems = row_elems_of(spec.shape);
  // Trailing dimensions from any rank's spec (they agree); rows from all ranks.
  int64_t total = 0;
  std::vector<Block> blocks;
  for (int64_t rows : r.rows) {
    if (rows < 0) throw ProtocolError("collective: negative allgather rows");
    blocks.push_back(
        Block{static_cast<size_t>(total * row_elems), static_cast<size_t>(rows * row_elems)});
    total += rows;
  }
  Array out(with_rows(spec.shape, total), spec.dtype);
  const size_t esize = dtype_size(spec.dtype);
  const Block& mine = blocks[static_cast<size_t>(rank_)];
  if (op && mine.count)
    std::memcpy(static_cast<char*>(out.data()) + mine.offset * esize, op->input.data,
                mine.count * esize);
  ring(ctx, out.data(), spec.dtype, ReduceOp::kSum, blocks, false, true);
  finish(spec.name, Status::ok(), std::move(out));
}

void Communicator::Impl::run_reduce_scatter(const Response& r, const Spec& spec, AlgoContext& ctx) {
  LocalOp* op = find(spec.name);
  const ReduceOp kop = kernel_op(spec.reduction);
  const int64_t rows = rows_of(spec.shape);
  const int64_t row_elems = row_elems_of(spec.shape);
  auto blocks = member_blocks(spec, static_cast<size_t>(rows), size_);
  const int64_t my_rows = static_cast<int64_t>(blocks[static_cast<size_t>(rank_)].count);
  for (auto& b : blocks) {
    b.offset *= static_cast<size_t>(row_elems);
    b.count *= static_cast<size_t>(row_elems);
  }
  const size_t count = static_cast<size_t>(spec.shape.numel());
  if (fusion_.size() < spec.bytes()) fusion_.resize(spec.bytes());
  if (op && count)
    std::memcpy(fusion_.data(), op->input.data, spec.bytes());
  else
    fill_identity(kop, spec.dtype, fusion_.data(), count);
  ring(ctx, fusion_.data(), spec.dtype, kop, blocks, true, false);
  const Block& mine = blocks[static_cast<size_t>(rank_)];
  const size_t esize = dtype_size(spec.dtype);
  char* mine_ptr = fusion_.data() + mine.offset * esize;
  if (spec.reduction == Reduction::kAverage)
    scale(spec.dtype, mine_ptr, 1.0 / (size_ - static_cast<int>(r.joined.size())), mine.count);
  if (!op) return;
  Array out(with_rows(spec.shape, my_rows), spec.dtype);
  if (mine.count) std::memcpy(out.data(), mine_ptr, mine.count * esize);
  finish(spec.name, Status::ok(), std::move(out));
}

}  // namespace pushpull::collective
