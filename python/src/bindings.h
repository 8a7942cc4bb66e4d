// SPDX-License-Identifier: Apache-2.0
// Internal header of the `_pushpull` Python extension (python/src/).
//
// module.cpp calls one bind_* function per part; each lives in its own file:
//   errors.cpp              bind_errors      pushpull.Error and subclasses
//   arrays.cpp              bind_arrays      array bridge helpers (to_view, dtype names)
//   kv_bindings.cpp         bind_kv          KVStore, OptimizerSpec (pushpull.kv)
//   collective_bindings.cpp bind_collective  Horovod-style collectives (pushpull.torch)
//   parking.cpp             bind_parking     arrays of timed-out operations, kept until done
//   elastic_bindings.cpp    bind_elastic     elastic jobs' round and host changes
//   timeline_bindings.cpp   bind_timeline    a program's own spans on the timeline
//   frontend_bindings.cpp   bind_frontend    the torch front ends' policy (frontend/)
//   trainer_bindings.cpp    bind_trainer     the Trainers' step (frontend/trainer_core.h)
//
// The array bridge (arrays.cpp) turns any numpy array or torch tensor into a
// pushpull::ArrayView WITHOUT linking libtorch: through the buffer protocol,
// DLPack (`__dlpack__` / `__dlpack_device__`) or `__array_interface__`. The
// view aliases the object's memory (no copy); non-contiguous arrays,
// unsupported dtypes, read-only outputs and non-CPU devices are rejected with
// pushpull::InvalidArgument (→ pushpull.InvalidArgument in Python).
//
// Threading: every function here needs the GIL. A view stays valid only while
// its Pinned (or the Python object it came from) is alive: asynchronous
// operations must keep the Pinned/keep-alive objects until their handle is
// done, and must destroy them with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <string_view>
#include <vector>

#include "pushpull/array.h"

namespace pushpull {
class KVStore;
}

namespace pushpull::python {

namespace py = pybind11;

void bind_errors(py::module_& m);
void bind_arrays(py::module_& m);
void bind_kv(py::module_& m);
void bind_collective(py::module_& m);
void bind_timeline(py::module_& m);
void bind_elastic(py::module_& m);
void bind_compression(py::module_& m);  // GradientCompressor (1bit/2bit for pushpull.torch)
void bind_frontend(py::module_& m);     // collective.GradientReducer (after bind_collective)
void bind_trainer(py::module_& m);      // TrainerCore (the Trainers' step)

// The store behind a `_pushpull.KVStore` (kv_bindings.cpp), looked up at
// every call (a closed store throws InvalidArgument). The caller keeps
// `store` alive as long as the getter; GIL needed only to make it.
std::function<KVStore&()> store_getter(py::handle store);

// A view of a Python array plus the reference that keeps its memory alive
// (the object itself, a held Py_buffer, or the consumed DLPack tensor).
struct Pinned {
  ArrayView view;
  py::object keep_alive;
};

// Views `obj` (numpy array, torch tensor, or anything exposing the buffer
// protocol / __dlpack__ / __array_interface__). `writable`: the call writes
// into it (pull outputs, in-place ops): read-only memory is rejected. `what`
// names the argument in error messages ("pull output for key 3").
// Throws pushpull::InvalidArgument: not an array, non-contiguous, unsupported
// dtype, more than Shape::kMaxDims dimensions, read-only output, or not on the
// CPU ("CUDA tensors are not supported yet; call .cpu()").
Pinned pin(py::handle obj, bool writable, std::string_view what);

// pin() for synchronous calls: the caller keeps `obj` alive for the call.
ArrayView to_view(py::handle obj, bool writable, std::string_view what);

// Keeps the arrays of an asynchronous operation alive; owned by its handle.
// Destroy with the GIL held (a py::object's destructor decrements refcounts).
using KeepAlive = std::vector<py::object>;

// The parking lot (parking.cpp): when a wait times out or a handle is dropped
// while its operation may still read or write the arrays (the network is not
// done with them), the arrays go here instead of being released, and are
// released once `done()` returns true (or throws: the operation failed).
// Finished entries are released by every later park_until_done and
// release_finished call, i.e. whenever a new operation starts. GIL held.
void park_until_done(std::function<bool()> done, KeepAlive keep);
// Releases finished entries; returns how many are still running.
size_t release_finished();
void bind_parking(py::module_& m);

}  // namespace pushpull::python
