// SPDX-License-Identifier: Apache-2.0
// bind_collective: the Horovod-style collective free functions of
// include/pushpull/collective.h as `_pushpull.collective` (used by
// pushpull.torch).
//
// Why these choices:
// - Blocking calls (init, the blocking ops, wait, join, barrier, shutdown)
//   release the GIL, so other Python threads (data loading, autograd hooks
//   submitting more ops) keep running while this one waits.
// - An async op's arrays are pinned (bindings.h) and the pins are owned by its
//   Handle until the op is done, so a caller that drops its own references
//   cannot free memory the engine still reads or writes. A Handle destroyed
//   before its op completed does not wait (as Horovod's): its pins are
//   parked until the op ends (bindings.h), so nothing is freed under the
//   engine and no destructor blocks.
// - allgather / reduce_scatter results are pushpull::Arrays handed to numpy
//   without a copy (a capsule owns the Array). numpy has no bfloat16, so a
//   bfloat16 result comes back as uint16 bits (pushpull.torch views it as
//   torch.bfloat16).
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "bindings.h"
#include "pushpull/collective.h"
#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull::python {
namespace {

namespace coll = pushpull::collective;

std::optional<Millis> to_millis(std::optional<double> seconds) {
  if (!seconds) return std::nullopt;
  if (*seconds < 0) {
    throw InvalidArgument(
        "pushpull.collective: timeout must be >= 0 seconds (or None for the default)");
  }
  return Millis(static_cast<int64_t>(*seconds * 1000.0));
}

py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::kFloat32:
      return py::dtype("float32");
    case DType::kFloat16:
      return py::dtype("float16");
    case DType::kBFloat16:
      return py::dtype("uint16");  // numpy has no bfloat16: the raw bits
    case DType::kFloat64:
      return py::dtype("float64");
    case DType::kInt32:
      return py::dtype("int32");
    case DType::kInt64:
      return py::dtype("int64");
    case DType::kInt8:
      return py::dtype("int8");
    case DType::kUInt8:
      return py::dtype("uint8");
  }
  throw InvalidArgument("pushpull.collective: result has an unknown dtype");
}

// Hands an Array to numpy without copying: a capsule owns it.
py::array to_numpy(Array&& a) {
  auto owned = std::make_unique<Array>(std::move(a));
  std::vector<py::ssize_t> shape(owned->shape().dims().begin(), owned->shape().dims().end());
  py::dtype dt = numpy_dtype(owned->dtype());
  if (owned->empty() || owned->numel() == 0) {
    return py::array(dt, shape);  // numpy allocates its own (empty) buffer
  }
  void* data = owned->data();
  py::capsule owner(owned.get(), [](void* p) { delete static_cast<Array*>(p); });
  owned.release();
  return py::array(dt, shape, data, owner);
}

// A pending operation plus the pinned arrays it reads and writes.
class PyHandle {
 public:
  PyHandle(coll::Handle h, KeepAlive keep, bool has_output)
      : handle_(std::move(h)), keep_(std::move(keep)), has_output_(has_output) {}
  PyHandle(const PyHandle&) = delete;
  PyHandle& operator=(const PyHandle&) = delete;

  ~PyHandle() {
    // Runs with the GIL held (pybind11 dealloc). Dropping a handle does not
    // wait for its op (Horovod's handles do not either: a test submits an op,
    // drops the handle and expects the next submission of that name to find
    // it still pending): the pinned arrays are parked until the op is over.
    // After shutdown() the engine has failed every op, so nothing is parked.
    if (!keep_.empty() && coll::is_initialized()) {
      coll::Handle h = handle_;
      park_until_done([h] { return !coll::is_initialized() || coll::poll(h); }, std::move(keep_));
    }
  }

  const std::string& name() const { return handle_.name(); }
  bool done() const { return coll::poll(handle_); }

  void wait(std::optional<double> timeout) {
    auto deadline = to_millis(timeout);
    {
      py::gil_scoped_release nogil;
      coll::wait(handle_, deadline);
    }
    keep_.clear();  // done: the engine no longer touches the arrays
  }

  py::object output(std::optional<double> timeout) {
    if (!has_output_) {
      throw InvalidArgument(fmt::format(
          "pushpull.collective: operation '{}' has no output to take (only allgather and "
          "reduce_scatter do; the others write into their arrays)",
          handle_.name()));
    }
    if (taken_) {
      throw InvalidArgument(
          fmt::format("pushpull.collective: the output of '{}' was already taken", handle_.name()));
    }
    auto deadline = to_millis(timeout);
    Array result;
    {
      py::gil_scoped_release nogil;
      result = coll::take_output(handle_, deadline);
    }
    keep_.clear();
    taken_ = true;
    return to_numpy(std::move(result));
  }

 private:
  coll::Handle handle_;
  KeepAlive keep_;
  bool has_output_ = false;
  bool taken_ = false;
};

// Process-set ops go to the default session's communicator (the free
// functions have no members argument); default_session() throws when not
// initialised. Ops over every rank keep using the free functions, which hold
// the session for the duration of the call.
coll::Communicator& comm() {
  return coll::default_session().communicator();
}

std::unique_ptr<PyHandle> allreduce_async(std::string name, py::object input, py::object output,
                                          coll::Reduction op, std::vector<int> members,
                                          double postscale) {
  KeepAlive keep;
  coll::Handle h;
  auto submit = [&](ArrayView in, ArrayView out) {
    return members.empty() && postscale == 1.0
               ? coll::allreduce_async(std::move(name), in, out, op)
               : comm().allreduce_async(std::move(name), in, out, op, std::move(members),
                                        postscale);
  };
  if (output.is_none() || output.is(input)) {
    Pinned p = pin(input, /*writable=*/true, fmt::format("allreduce '{}' tensor", name));
    keep.push_back(std::move(p.keep_alive));
    h = submit(p.view, p.view);
  } else {
    Pinned in = pin(input, /*writable=*/false, fmt::format("allreduce '{}' input", name));
    Pinned out = pin(output, /*writable=*/true, fmt::format("allreduce '{}' output", name));
    keep.push_back(std::move(in.keep_alive));
    keep.push_back(std::move(out.keep_alive));
    h = submit(in.view, out.view);
  }
  return std::make_unique<PyHandle>(std::move(h), std::move(keep), false);
}

std::unique_ptr<PyHandle> broadcast_async(std::string name, py::object data, int root,
                                          std::vector<int> members) {
  Pinned p = pin(data, /*writable=*/true, fmt::format("broadcast '{}' tensor", name));
  coll::Handle h = members.empty()
                       ? coll::broadcast_async(std::move(name), p.view, root)
                       : comm().broadcast_async(std::move(name), p.view, root, std::move(members));
  KeepAlive keep;
  keep.push_back(std::move(p.keep_alive));
  return std::make_unique<PyHandle>(std::move(h), std::move(keep), false);
}

std::unique_ptr<PyHandle> allgather_async(std::string name, py::object input,
                                          std::vector<int> members) {
  Pinned p = pin(input, /*writable=*/false, fmt::format("allgather '{}' input", name));
  coll::Handle h = members.empty()
                       ? coll::allgather_async(std::move(name), p.view)
                       : comm().allgather_async(std::move(name), p.view, std::move(members));
  KeepAlive keep;
  keep.push_back(std::move(p.keep_alive));
  return std::make_unique<PyHandle>(std::move(h), std::move(keep), true);
}

std::unique_ptr<PyHandle> reduce_scatter_async(std::string name, py::object input,
                                               coll::Reduction op, std::vector<int> members) {
  Pinned p = pin(input, /*writable=*/false, fmt::format("reduce_scatter '{}' input", name));
  coll::Handle h = members.empty() ? coll::reduce_scatter_async(std::move(name), p.view, op)
                                   : comm().reduce_scatter_async(std::move(name), p.view, op,
                                                                 std::move(members));
  KeepAlive keep;
  keep.push_back(std::move(p.keep_alive));
  return std::make_unique<PyHandle>(std::move(h), std::move(keep), true);
}

}  // namespace

void bind_collective(py::module_& m) {
  py::module_ c =
      m.def_submodule("collective",
                      "Horovod-style collectives over the process-default session "
                      "(include/pushpull/collective.h). pushpull.torch is the user-facing API.");

  py::enum_<coll::Reduction>(c, "Reduction")
      .value("SUM", coll::Reduction::kSum)
      .value("AVERAGE", coll::Reduction::kAverage)
      .value("MIN", coll::Reduction::kMin)
      .value("MAX", coll::Reduction::kMax)
      .value("PRODUCT", coll::Reduction::kProduct);

  py::class_<PyHandle>(c, "Handle",
                       "A pending collective. Keeps its arrays alive until done; "
                       "destroying it before completion parks them until the operation ends.")
      .def_property_readonly("name", &PyHandle::name)
      .def("done", &PyHandle::done, "True once the operation completed (or failed).")
      .def("wait", &PyHandle::wait, py::arg("timeout") = py::none(),
           "Blocks (GIL released) until done; raises the operation's error, or "
           "pushpull.Timeout after `timeout` seconds (default: the session's wait timeout).")
      .def("output", &PyHandle::output, py::arg("timeout") = py::none(),
           "wait(), then the allgather / reduce_scatter result as a numpy array "
           "(bfloat16 as uint16 bits). Once only.");

  c.def(
      "init",
      [] {
        Options options = Options::from_env();
        py::gil_scoped_release nogil;
        coll::init(options);
      },
      "Joins the workers' group (blocks until every rank joined, at most the startup "
      "timeout). A second call does nothing.");
  c.def("is_initialized", &coll::is_initialized);
  c.def(
      "shutdown",
      [] {
        py::gil_scoped_release nogil;
        coll::shutdown();
      },
      "Leaves the group (local, not collective). Nothing when not initialised.");
  c.def("size", [] { return coll::size(); });
  c.def("rank", [] { return coll::rank(); });
  c.def("local_rank", [] { return coll::local_rank(); });
  c.def("local_size", [] { return coll::local_size(); });
  c.def(
      "rank_environment", [] { return coll::rank_environment(); },
      "[(name, value)]: this process's place as RANK, WORLD_SIZE, ... HOROVOD_CROSS_SIZE.");
  c.def(
      "mode", [] { return std::string(coll::default_session().mode()); },
      "'single', 'cluster' or 'rendezvous': how the group was found.");

  // members: a process set's ranks (empty: every rank); see Communicator.
  const auto all = std::vector<int>{};
  c.def("allreduce_async", &allreduce_async, py::arg("name"), py::arg("input"),
        py::arg("output") = py::none(), py::arg("op") = coll::Reduction::kSum,
        py::arg("members") = all, py::arg("postscale") = 1.0,
        "output = reduction of every rank's input, times postscale (every member passes the "
        "same factor; applied inside the algorithm); output None (or input) means in place.");
  c.def("broadcast_async", &broadcast_async, py::arg("name"), py::arg("data"), py::arg("root"),
        py::arg("members") = all, "data on every rank becomes root's (in place).");
  c.def("allgather_async", &allgather_async, py::arg("name"), py::arg("input"),
        py::arg("members") = all,
        "Concatenation along the first dimension in rank order; result via output().");
  c.def("reduce_scatter_async", &reduce_scatter_async, py::arg("name"), py::arg("input"),
        py::arg("op") = coll::Reduction::kSum, py::arg("members") = all);

  c.def(
      "allreduce",
      [](std::string name, py::object input, py::object output, coll::Reduction op) {
        allreduce_async(std::move(name), std::move(input), std::move(output), op, {}, 1.0)
            ->wait(std::nullopt);
      },
      py::arg("name"), py::arg("input"), py::arg("output") = py::none(),
      py::arg("op") = coll::Reduction::kSum);
  c.def(
      "broadcast",
      [](std::string name, py::object data, int root) {
        broadcast_async(std::move(name), std::move(data), root, {})->wait(std::nullopt);
      },
      py::arg("name"), py::arg("data"), py::arg("root"));
  c.def(
      "allgather",
      [](std::string name, py::object input) {
        return allgather_async(std::move(name), std::move(input), {})->output(std::nullopt);
      },
      py::arg("name"), py::arg("input"));
  c.def(
      "reduce_scatter",
      [](std::string name, py::object input, coll::Reduction op) {
        return reduce_scatter_async(std::move(name), std::move(input), op, {})
            ->output(std::nullopt);
      },
      py::arg("name"), py::arg("input"), py::arg("op") = coll::Reduction::kSum);
  c.def("barrier", [] {
    py::gil_scoped_release nogil;
    coll::barrier();
  });
  c.def(
      "join",
      [] {
        py::gil_scoped_release nogil;
        return coll::join();
      },
      "This rank is out of data: until every rank joined it contributes the identity "
      "to the others' ops. Returns once every rank joined, with the rank that joined last.");
}

}  // namespace pushpull::python
