// SPDX-License-Identifier: Apache-2.0
// ProcessGroupPushpull's data movement: broadcast, the allgathers, gather, the all-to-alls (over
// allgather) and barrier (process_group.h).
#include <fmt/format.h>

#include <utility>

#include "op_helpers.h"
#include "process_group.h"
#include "pushpull/error.h"
#include "tensors.h"

namespace pushpull::torch_pg {
// The helpers of op_helpers.h, by their short names.
using namespace detail;
using collective::Handle;

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
