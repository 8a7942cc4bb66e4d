// SPDX-License-Identifier: Apache-2.0
#include "process_group.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "meet.h"
#include "pushpull/error.h"
#include "tensors.h"

namespace pushpull::torch_pg {
namespace {

using collective::Handle;
using collective::Reduction;
using detail::check_same;
using detail::check_single;
using detail::check_tensor;
using detail::describe;
using detail::flat_view;
using detail::Unsupported;

std::function<void(const std::function<void()>&)>& blocking_region() {
  static std::function<void(const std::function<void()>&)> f;
  return f;
}

Reduction reduction_of(const c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return Reduction::kSum;
    case c10d::ReduceOp::AVG:
      return Reduction::kAverage;
    case c10d::ReduceOp::MIN:
      return Reduction::kMin;
    case c10d::ReduceOp::MAX:
      return Reduction::kMax;
    case c10d::ReduceOp::PRODUCT:
      return Reduction::kProduct;
    default:
      throw Unsupported(fmt::format(
          "pushpull ProcessGroup: {}: reduce op {} is not supported; pushpull reduces with SUM, "
          "AVG, MIN, MAX and PRODUCT (no bitwise ops, no PREMUL_SUM)",
          what, static_cast<int>(op.op_)));
  }
}

std::string dtype_str(const at::Tensor& t) {
  return std::string(dtype_name(*detail::engine_dtype(t.scalar_type())));
}

// The tensor the engine works on: `t` itself when contiguous, else a copy.
at::Tensor contiguous(const at::Tensor& t) {
  return t.is_contiguous() ? t : t.contiguous();
}

// Copies `from` (contiguous, same dtype and numel) into `to` unless they are one tensor.
void copy_back(const at::Tensor& to, const at::Tensor& from) {
  if (to.data_ptr() != from.data_ptr()) to.copy_(from.view(to.sizes()));
}

// Copies an engine result (numel elements of `like`'s dtype) into `to`.
void copy_result(const Array& a, const at::Tensor& to, int64_t offset_elements = 0) {
  const auto item = static_cast<int64_t>(dtype_size(a.dtype()));
  auto* base = static_cast<char*>(a.data()) + offset_elements * item;
  to.copy_(detail::wrap(base, to.numel(), to).view(to.sizes()));
}

// An allgather's result: `ranks` rows of `n` elements (the engine checked
// that every rank passed n).
const Array& check_gathered(const Array& all, int64_t n, int64_t ranks) {
  if (all.numel() != n * ranks) {
    throw Internal(fmt::format("pushpull ProcessGroup: allgather returned {} elements, not {} x {}",
                               all.numel(), ranks, n));
  }
  return all;
}

void check_root(int64_t root, int size, const char* what) {
  if (root < 0 || root >= size) {
    throw Unsupported(fmt::format("pushpull ProcessGroup: {}: root rank {} is not in 0..{}", what,
                                  root, size - 1));
  }
}

}  // namespace

void ProcessGroupPushpull::set_blocking_region(
    std::function<void(const std::function<void()>&)> f) {
  blocking_region() = std::move(f);
}

ProcessGroupPushpull::ProcessGroupPushpull(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout)
    : ProcessGroupPushpull(meet(store, rank, size), timeout) {}

ProcessGroupPushpull::ProcessGroupPushpull(std::shared_ptr<collective::Session> session,
                                           std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(session->rank(), session->size()),
      session_(std::move(session)),
      timeout_(timeout) {
  init();  // c10d's logging of the new group
}

ProcessGroupPushpull::~ProcessGroupPushpull() {
  shutdown();
}

std::string ProcessGroupPushpull::mode() const {
  return std::string(session_->mode());
}

void ProcessGroupPushpull::shutdown() {
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    shut_ = true;
  }
  auto body = [this] {
    session_->shutdown();  // pending ops fail at once; the engine thread ends
    completer_.stop();     // finishes (fails) what is queued
  };
  if (blocking_region()) {
    blocking_region()(body);
  } else {
    body();
  }
}

std::string ProcessGroupPushpull::next_name(const std::string& signature) {
  const uint64_t n = counters_[signature]++;
  std::string name = fmt::format("{}#{}", signature, n % kSlots);
  auto it = last_by_name_.find(name);
  if (it != last_by_name_.end()) {
    auto& comm = session_->communicator();
    if (!comm.poll(it->second)) {
      // kSlots ops of this signature in flight: the oldest must finish before
      // its name is reused. Every rank has submitted it (same order), so it ends.
      try {
        comm.wait(it->second, timeout_);
      } catch (const Timeout&) {
        if (!comm.poll(it->second)) throw;
      } catch (const Error&) {
        // That op's own failure, reported by its work.
      }
    }
  }
  return name;
}

void ProcessGroupPushpull::remember(const std::string& name, const Handle& h) {
  last_by_name_[name] = h;
  if (last_by_name_.size() > 4096) {
    auto& comm = session_->communicator();
    std::erase_if(last_by_name_, [&](const auto& kv) { return comm.poll(kv.second); });
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::launch(
    c10d::OpType type, const char* title, std::string what, const std::vector<at::Tensor>& inputs,
    std::vector<at::Tensor> keep_alive, std::vector<at::Tensor> result,
    const std::function<Submitted()>& submit) {
  const auto deadline = PushpullWork::Clock::now() + timeout_;
  std::lock_guard<std::mutex> lock(submit_mu_);
  if (shut_) {
    throw Unsupported(fmt::format(
        "pushpull ProcessGroup: {} after the process group was shut down (destroy_process_group)",
        what));
  }
  Submitted s = submit();
  auto work = c10::make_intrusive<PushpullWork>(
      session_, std::move(s.handles), std::move(s.finisher), std::move(keep_alive),
      std::move(result), deadline, std::move(what), rank_, type, title, inputs);
  completer_.add(work);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::done_now(c10d::OpType type,
                                                              std::vector<at::Tensor> result) {
  auto work = c10::make_intrusive<PushpullWork>(
      session_, std::vector<Handle>{}, nullptr, std::vector<at::Tensor>{}, std::move(result),
      PushpullWork::Clock::now() + timeout_, "an empty operation", rank_, type, nullptr,
      std::vector<at::Tensor>{});
  work->complete_by_deadline();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::allreduce(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceOptions& opts) {
  check_single(tensors, "allreduce");
  const at::Tensor t = tensors[0];
  check_tensor(t, "allreduce: tensor");
  const Reduction op = reduction_of(opts.reduceOp, "allreduce");
  if (t.numel() == 0) return done_now(c10d::OpType::ALLREDUCE, tensors);
  const at::Tensor buf = contiguous(t);
  const std::string sig = fmt::format("allreduce.{}.{}", dtype_str(t), reduction_name(op));
  return launch(c10d::OpType::ALLREDUCE, "pushpull:all_reduce", "allreduce of " + describe(t),
                tensors, {t, buf}, tensors, [&]() -> Submitted {
                  const std::string name = next_name(sig);
                  Handle h = session_->communicator().allreduce_async(name, flat_view(buf), op);
                  remember(name, h);
                  return {{h}, [t, buf] { copy_back(t, buf); }};
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const Reduction op = reduction_of(opts.reduceOp, "allreduce_coalesced");
  std::vector<at::Tensor> bufs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_tensor(tensors[i], fmt::format("allreduce_coalesced: tensor {}", i));
    bufs.push_back(contiguous(tensors[i]));
  }
  std::vector<at::Tensor> keep = tensors;
  keep.insert(keep.end(), bufs.begin(), bufs.end());
  return launch(
      c10d::OpType::ALLREDUCE_COALESCED, "pushpull:all_reduce_coalesced",
      fmt::format("allreduce_coalesced of {} tensors", tensors.size()), tensors, keep, tensors,
      [&]() -> Submitted {
        // One engine op per tensor: the engine fuses them into one buffer.
        std::vector<Handle> handles;
        for (size_t i = 0; i < bufs.size(); ++i) {
          if (bufs[i].numel() == 0) continue;
          const std::string name =
              next_name(fmt::format("allreduce.{}.{}", dtype_str(bufs[i]), reduction_name(op)));
          handles.push_back(session_->communicator().allreduce_async(name, flat_view(bufs[i]), op));
          remember(name, handles.back());
        }
        return {std::move(handles), [tensors = tensors, bufs] {
                  for (size_t i = 0; i < bufs.size(); ++i)
                    copy_back(tensors[i], bufs[i]);
                }};
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::broadcast(std::vector<at::Tensor>& tensors,
                                                               const c10d::BroadcastOptions& opts) {
  check_single(tensors, "broadcast");
  const at::Tensor t = tensors[0];
  check_tensor(t, "broadcast: tensor");
  check_root(opts.rootRank, size_, "broadcast");
  if (opts.rootTensor != 0) {
    throw Unsupported(
        "pushpull ProcessGroup: broadcast: root_tensor must be 0 (one tensor per rank)");
  }
  if (t.numel() == 0) return done_now(c10d::OpType::BROADCAST, tensors);
  const at::Tensor buf = contiguous(t);
  const int root = static_cast<int>(opts.rootRank);
  const std::string sig = fmt::format("broadcast.{}.{}", dtype_str(t), root);
  return launch(c10d::OpType::BROADCAST, "pushpull:broadcast", "broadcast of " + describe(t),
                tensors, {t, buf}, tensors, [&]() -> Submitted {
                  const std::string name = next_name(sig);
                  Handle h = session_->communicator().broadcast_async(name, flat_view(buf), root);
                  remember(name, h);
                  return {{h}, [t, buf] { copy_back(t, buf); }};
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::reduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::ReduceOptions& opts) {
  check_single(tensors, "reduce");
  const at::Tensor t = tensors[0];
  check_tensor(t, "reduce: tensor");
  check_root(opts.rootRank, size_, "reduce");
  const Reduction op = reduction_of(opts.reduceOp, "reduce");
  if (t.numel() == 0) return done_now(c10d::OpType::REDUCE, tensors);
  // An allreduce; only the root keeps the result (the others' tensors are left as they were).
  const bool root = opts.rootRank == rank_;
  const at::Tensor buf = root ? contiguous(t) : t.contiguous().clone();
  const std::string sig =
      fmt::format("reduce.{}.{}.{}", dtype_str(t), reduction_name(op), opts.rootRank);
  return launch(c10d::OpType::REDUCE, "pushpull:reduce", "reduce of " + describe(t), tensors,
                {t, buf}, tensors, [&]() -> Submitted {
                  const std::string name = next_name(sig);
                  Handle h = session_->communicator().allreduce_async(name, flat_view(buf), op);
                  remember(name, h);
                  return {{h}, [t, buf, root] {
                            if (root) copy_back(t, buf);
                          }};
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  check_single(inputs, "allgather");
  const at::Tensor in = inputs[0];
  check_tensor(in, "allgather: input");
  if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
    throw Unsupported(fmt::format(
        "pushpull ProcessGroup: allgather needs one output list of {} tensors (one per rank)",
        size_));
  }
  const std::vector<at::Tensor> outs = outputs[0];
  for (size_t r = 0; r < outs.size(); ++r) {
    check_tensor(outs[r], fmt::format("allgather: output {}", r));
    check_same(outs[r], in, fmt::format("allgather: output {}", r));
  }
  if (in.numel() == 0) return done_now(c10d::OpType::ALLGATHER, outs);
  const at::Tensor buf = contiguous(in);
  std::vector<at::Tensor> keep = outs;
  keep.push_back(buf);
  const std::string sig = fmt::format("allgather.{}", dtype_str(in));
  return launch(c10d::OpType::ALLGATHER, "pushpull:all_gather", "allgather of " + describe(in),
                inputs, keep, outs, [&]() -> Submitted {
                  const std::string name = next_name(sig);
                  auto session = session_;
                  Handle h = session->communicator().allgather_async(name, detail::row_view(buf));
                  remember(name, h);
                  const int64_t n = in.numel();
                  return {{h}, [session, h, outs, n] {
                            Array all = session->communicator().take_output(h, Millis(0));
                            check_gathered(all, n, static_cast<int64_t>(outs.size()));
                            for (size_t r = 0; r < outs.size(); ++r)
                              copy_result(all, outs[r], static_cast<int64_t>(r) * n);
                          }};
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) {
  check_tensor(input, "_allgather_base: input");
  check_tensor(output, "_allgather_base: output");
  if (output.scalar_type() != input.scalar_type() || output.numel() != input.numel() * size_) {
    throw Unsupported(fmt::format(
        "pushpull ProcessGroup: _allgather_base: output ({}) must hold world size ({}) times the "
        "input ({}), same dtype",
        describe(output), size_, describe(input)));
  }
  if (input.numel() == 0) return done_now(c10d::OpType::_ALLGATHER_BASE, {output});
  const at::Tensor buf = contiguous(input);
  const at::Tensor out = output;
  const std::string sig = fmt::format("allgather.{}", dtype_str(input));
  return launch(c10d::OpType::_ALLGATHER_BASE, "pushpull:_all_gather_base",
                "allgather of " + describe(input), {input}, {out, buf}, {out}, [&]() -> Submitted {
                  const std::string name = next_name(sig);
                  auto session = session_;
                  Handle h = session->communicator().allgather_async(name, detail::row_view(buf));
                  remember(name, h);
                  const int64_t ranks = size_;
                  return {{h}, [session, h, out, ranks] {
                            copy_result(
                                check_gathered(session->communicator().take_output(h, Millis(0)),
                                               out.numel() / ranks, ranks),
                                out);
                          }};
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  check_single(inputs, "gather");
  const at::Tensor in = inputs[0];
  check_tensor(in, "gather: input");
  check_root(opts.rootRank, size_, "gather");
  const bool root = opts.rootRank == rank_;
  std::vector<at::Tensor> outs;
  if (root) {
    if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
      throw Unsupported(fmt::format(
          "pushpull ProcessGroup: gather: the root needs one output list of {} tensors", size_));
    }
    outs = outputs[0];
    for (size_t r = 0; r < outs.size(); ++r) {
      check_tensor(outs[r], fmt::format("gather: output {}", r));
      check_same(outs[r], in, fmt::format("gather: output {}", r));
    }
  } else if (!outputs.empty() && !outputs[0].empty()) {
    throw Unsupported("pushpull ProcessGroup: gather: only the root passes output tensors");
  }
  if (in.numel() == 0) return done_now(c10d::OpType::GATHER, outs);
  // An allgather of which only the root keeps the result.
  const at::Tensor buf = contiguous(in);
  std::vector<at::Tensor> keep = outs;
  keep.push_back(buf);
  const std::string sig = fmt::format("gather.{}.{}", dtype_str(in), opts.rootRank);
  return launch(c10d::OpType::GATHER, "pushpull:gather", "gather of " + describe(in), inputs, keep,
                outs, [&]() -> Submitted {
                  const std::string name = next_name(sig);
                  auto session = session_;
                  Handle h = session->communicator().allgather_async(name, detail::row_view(buf));
                  remember(name, h);
                  const int64_t n = in.numel(), ranks = size_;
                  return {{h}, [session, h, outs, n, ranks] {
                            Array all = session->communicator().take_output(h, Millis(0));
                            check_gathered(all, n, ranks);
                            for (size_t r = 0; r < outs.size(); ++r)
                              copy_result(all, outs[r], static_cast<int64_t>(r) * n);
                          }};
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  check_single(outputs, "reduce_scatter");
  const at::Tensor out = outputs[0];
  check_tensor(out, "reduce_scatter: output");
  const Reduction op = reduction_of(opts.reduceOp, "reduce_scatter");
  if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(size_)) {
    throw Unsupported(fmt::format(
        "pushpull ProcessGroup: reduce_scatter needs one input list of {} tensors (one per rank)",
        size_));
  }
  std::vector<at::Tensor> flat;
  for (size_t r = 0; r < inputs[0].size(); ++r) {
    check_tensor(inputs[0][r], fmt::format("reduce_scatter: input {}", r));
    check_same(inputs[0][r], out, fmt::format("reduce_scatter: input {}", r));
    flat.push_back(inputs[0][r].reshape({-1}));
  }
  if (out.numel() == 0) return done_now(c10d::OpType::REDUCE_SCATTER, outputs);
  // Rank r's block of the concatenation is exactly its numel elements.
  const at::Tensor buf = at::cat(flat);
  const std::string sig = fmt::format("reduce_scatter.{}.{}", dtype_str(out), reduction_name(op));
  return launch(c10d::OpType::REDUCE_SCATTER, "pushpull:reduce_scatter",
                "reduce_scatter of " + describe(out), inputs[0], {out, buf}, outputs,
                [&]() -> Submitted {
                  const std::string name = next_name(sig);
                  auto session = session_;
                  Handle h = session->communicator().reduce_scatter_async(name, flat_view(buf), op);
                  remember(name, h);
                  return {{h}, [session, h, out] {
                            copy_result(session->communicator().take_output(h, Millis(0)), out);
                          }};
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_tensor(input, "_reduce_scatter_base: input");
  check_tensor(output, "_reduce_scatter_base: output");
  const Reduction op = reduction_of(opts.reduceOp, "_reduce_scatter_base");
  if (output.scalar_type() != input.scalar_type() || input.numel() != output.numel() * size_) {
    throw Unsupported(fmt::format(
        "pushpull ProcessGroup: _reduce_scatter_base: input ({}) must hold world size ({}) times "
        "the output ({}), same dtype",
        describe(input), size_, describe(output)));
  }
  if (output.numel() == 0) return done_now(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
  const at::Tensor buf = contiguous(input);
  const at::Tensor out = output;
  const std::string sig = fmt::format("reduce_scatter.{}.{}", dtype_str(out), reduction_name(op));
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, "pushpull:_reduce_scatter_base",
                "reduce_scatter of " + describe(input), {input}, {out, buf}, {out},
                [&]() -> Submitted {
                  const std::string name = next_name(sig);
                  auto session = session_;
                  Handle h = session->communicator().reduce_scatter_async(name, flat_view(buf), op);
                  remember(name, h);
                  return {{h}, [session, h, out] {
                            copy_result(session->communicator().take_output(h, Millis(0)), out);
                          }};
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions&) {
  check_tensor(input, "alltoall_base: input");
  check_tensor(output, "alltoall_base: output");
  if (!output_splits.empty() || !input_splits.empty()) {
    throw Unsupported(
        "pushpull ProcessGroup: all_to_all_single with split sizes is not supported (pushpull's "
        "engine has no all-to-all; equal splits run over allgather)");
  }
  if (output.scalar_type() != input.scalar_type() || output.numel() != input.numel() ||
      input.numel() % size_ != 0) {
    throw Unsupported(fmt::format(
        "pushpull ProcessGroup: all_to_all_single: input ({}) and output ({}) must have the "
        "same dtype and number of elements, divisible by the world size {}",
        describe(input), describe(output), size_));
  }
  if (input.numel() == 0) return done_now(c10d::OpType::ALLTOALL_BASE, {output});
  // Over allgather: every rank receives every input and keeps block `rank`
  // of each (size times the traffic of a real all-to-all).
  const at::Tensor buf = contiguous(input);
  const at::Tensor out = output;
  const int64_t block = input.numel() / size_;
  const std::string sig = fmt::format("alltoall.{}", dtype_str(input));
  return launch(
      c10d::OpType::ALLTOALL_BASE, "pushpull:all_to_all", "all_to_all of " + describe(input),
      {input}, {out, buf}, {out}, [&]() -> Submitted {
        const std::string name = next_name(sig);
        auto session = session_;
        Handle h = session->communicator().allgather_async(name, detail::row_view(buf));
        remember(name, h);
        const int64_t n = input.numel(), me = rank_, ranks = size_;
        return {
            {h}, [session, h, out, n, block, me, ranks] {
              Array all = session->communicator().take_output(h, Millis(0));
              check_gathered(all, n, ranks);
              at::Tensor gathered = detail::wrap(all.data(), n * ranks, out);
              at::Tensor mine = gathered.view({ranks, ranks, block}).select(1, me).reshape({-1});
              out.copy_(mine.view(out.sizes()));
            }};
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::alltoall(std::vector<at::Tensor>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllToAllOptions&) {
  if (outputs.size() != static_cast<size_t>(size_) || inputs.size() != outputs.size()) {
    throw Unsupported(fmt::format(
        "pushpull ProcessGroup: all_to_all needs {} input and {} output tensors (one per rank)",
        size_, size_));
  }
  for (size_t r = 0; r < inputs.size(); ++r) {
    check_tensor(inputs[r], fmt::format("all_to_all: input {}", r));
    check_tensor(outputs[r], fmt::format("all_to_all: output {}", r));
    check_same(inputs[r], inputs[0], fmt::format("all_to_all: input {}", r));
    check_same(outputs[r], inputs[0], fmt::format("all_to_all: output {}", r));
  }
  const int64_t block = inputs[0].numel();
  if (block == 0) return done_now(c10d::OpType::ALLTOALL, outputs);
  std::vector<at::Tensor> flat;
  for (const auto& t : inputs)
    flat.push_back(t.reshape({-1}));
  const at::Tensor buf = at::cat(flat);
  std::vector<at::Tensor> keep = outputs;
  keep.push_back(buf);
  const std::string sig = fmt::format("alltoall.{}", dtype_str(buf));
  const std::vector<at::Tensor> outs = outputs;
  return launch(c10d::OpType::ALLTOALL, "pushpull:all_to_all",
                "all_to_all of " + describe(inputs[0]), inputs, keep, outs, [&]() -> Submitted {
                  const std::string name = next_name(sig);
                  auto session = session_;
                  Handle h = session->communicator().allgather_async(name, detail::row_view(buf));
                  remember(name, h);
                  const int64_t me = rank_, ranks = size_;
                  return {{h}, [session, h, outs, block, me, ranks] {
                            Array all = session->communicator().take_output(h, Millis(0));
                            check_gathered(all, block * ranks, ranks);
                            // Rank j's input block `me` is at (j * ranks + me) * block.
                            for (int64_t j = 0; j < ranks; ++j)
                              copy_result(all, outs[static_cast<size_t>(j)],
                                          (j * ranks + me) * block);
                          }};
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPushpull::barrier(const c10d::BarrierOptions&) {
  return launch(c10d::OpType::BARRIER, "pushpull:barrier", "barrier", {}, {}, {},
                [&]() -> Submitted {
                  return {{session_->communicator().barrier_async()}, nullptr};
                });
}

}  // namespace pushpull::torch_pg
