// SPDX-License-Identifier: Apache-2.0
// broadcast_parameters and broadcast_optimizer_state (Horovod's
// hvd.broadcast_parameters / hvd.broadcast_optimizer_state) over the
// collectives.
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <set>

#include "pushpull/torch/distributed_optimizer.h"
#include "tensor_collectives.h"

namespace pushpull::torch {
namespace {

using namespace detail;

void check_root(const char* what, int root, const Communicator& comm) {
  if (root < 0 || root >= comm.size()) {
    throw InvalidArgument(std::string(what) + ": root_rank " + std::to_string(root) +
                          " is not a rank of this group of " + std::to_string(comm.size()));
  }
}

// What every rank's optimizer must agree on before loading root's state:
// parameter groups with their parameters' dtypes and shapes, in order.
std::string signature(const ::torch::optim::Optimizer& opt) {
  std::string s;
  for (const auto& g : opt.param_groups()) {
    s += "group(";
    for (const auto& p : g.params())
      s += describe(p) + ";";
    s += ")";
  }
  return s;
}

}  // namespace

void broadcast_parameters(const NamedTensors& tensors, int root_rank, Communicator& comm) {
  check_root("broadcast_parameters", root_rank, comm);
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    if (!names.insert(name).second) {
      throw InvalidArgument("broadcast_parameters: the name '" + name + "' appears twice");
    }
    if (auto problem = layout_problem(t, false); !problem.empty()) {
      throw InvalidArgument("broadcast_parameters: '" + name + "', " + describe(t) + ", " +
                            problem);
    }
  }
  std::vector<at::Tensor> buffers;
  std::vector<Handle> handles;
  for (const auto& [name, t] : tensors) {
    // In place through data_ptr (autograd is not involved: leaves are
    // overwritten the way a checkpoint load would).
    buffers.push_back(t.is_contiguous() ? t : t.contiguous());
    handles.push_back(
        comm.broadcast_async("broadcast_parameters." + name, view_of(buffers.back()), root_rank));
  }
  wait_all(comm, handles);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i].second;
    if (buffers[i].data_ptr() != t.data_ptr()) {
      // A non-contiguous tensor went through a copy: write it back.
      at::Tensor target = t;
      target.copy_(buffers[i]);
    }
  }
}

void broadcast_parameters(const NamedTensors& tensors, int root_rank) {
  broadcast_parameters(tensors, root_rank, default_communicator("broadcast_parameters"));
}

void broadcast_optimizer_state(::torch::optim::Optimizer& optimizer, int root_rank,
                               Communicator& comm) {
  check_root("broadcast_optimizer_state", root_rank, comm);
  const bool root = comm.rank() == root_rank;
  std::string bytes;
  if (root) {
    // libtorch's archive: per-parameter state keyed in the optimizer's fixed
    // parameter order (load() maps it onto the receiver's parameters), plus
    // each group's options, which load() alone does not restore.
    ::torch::serialize::OutputArchive archive, state;
    optimizer.save(state);
    archive.write("state", state);
    const auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      ::torch::serialize::OutputArchive options;
      groups[g].options().serialize(options);
      archive.write("options/" + std::to_string(g), options);
    }
    archive.write("signature", c10::IValue(signature(optimizer)));
    archive.save_to([&](const void* data, size_t n) {
      bytes.append(static_cast<const char*>(data), n);
      return n;
    });
  }
  int64_t count = static_cast<int64_t>(bytes.size());
  comm.broadcast("broadcast_optimizer_state.count", ArrayView(&count, DType::kInt64, Shape{1}),
                 root_rank);
  if (count <= 0) {
    throw ProtocolError("broadcast_optimizer_state: rank " + std::to_string(root_rank) +
                        " sent an empty optimizer archive");
  }
  bytes.resize(static_cast<size_t>(count));
  comm.broadcast("broadcast_optimizer_state.bytes",
                 ArrayView(bytes.data(), DType::kUInt8, Shape{count}), root_rank);
  if (root) return;
  try {
    ::torch::serialize::InputArchive archive, state;
    archive.load_from(bytes.data(), bytes.size());
    c10::IValue theirs;
    archive.read("signature", theirs);
    const std::string mine = signature(optimizer);
    if (theirs.toStringRef() != mine) {
      throw InvalidArgument("broadcast_optimizer_state: rank " + std::to_string(comm.rank()) +
                            "'s optimizer has parameters " + mine + " but root rank " +
                            std::to_string(root_rank) + "'s has " + theirs.toStringRef() +
                            "; every rank must build the same optimizer over the same model");
    }
    archive.read("state", state);
    optimizer.state().clear();  // what root has no state for must not survive here
    optimizer.load(state);
    auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      ::torch::serialize::InputArchive in;
      archive.read("options/" + std::to_string(g), in);
      auto options = groups[g].options().clone();
      options->serialize(in);
      groups[g].set_options(std::move(options));
    }
  } catch (const c10::Error& e) {
    throw InvalidArgument(
        "broadcast_optimizer_state: rank " + std::to_string(comm.rank()) +
        " cannot load root rank " + std::to_string(root_rank) +
        "'s optimizer state (is it the same optimizer type?): " + e.what_without_backtrace());
  }
}

void broadcast_optimizer_state(::torch::optim::Optimizer& optimizer, int root_rank) {
  broadcast_optimizer_state(optimizer, root_rank,
                            default_communicator("broadcast_optimizer_state"));
}

}  // namespace pushpull::torch
