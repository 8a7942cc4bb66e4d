// SPDX-License-Identifier: Apache-2.0
// ProcessGroupPushpull's reductions: allreduce, allreduce_coalesced, reduce, reduce_scatter and
// _reduce_scatter_base (process_group.h).
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
using collective::Reduction;

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
                [&] { return submit_reduce_scatter(sig, buf, out, op); });
}

ProcessGroupPushpull::Submitted ProcessGroupPushpull::submit_reduce_scatter(
    const std::string& signature, const at::Tensor& buf, const at::Tensor& out, Reduction op) {
  const std::string name = next_name(signature);
  auto session = session_;
  Handle h = session->communicator().reduce_scatter_async(name, flat_view(buf), op);
  remember(name, h);
  return {{h}, [session, h, out] {
            copy_result(session->communicator().take_output(h, Millis(0)), out);
          }};
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
                [&] { return submit_reduce_scatter(sig, buf, out, op); });
}

}  // namespace pushpull::torch_pg
