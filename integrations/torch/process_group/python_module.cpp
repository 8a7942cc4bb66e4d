// SPDX-License-Identifier: Apache-2.0
// `pushpull._pushpull_torch_pg`: ProcessGroupPushpull for Python, linked
// against libtorch (unlike `pushpull._pushpull`, which never is). Imported by
// pushpull.torch.distributed, which checks the facts below against the
// running torch and registers the backend.
//
// The class derives from torch.distributed.ProcessGroup in pybind11 terms,
// with c10::intrusive_ptr holders as torch's own bindings use, so
// init_process_group, DDP and the torch.distributed calls accept it.
#include <torch/csrc/api/include/torch/version.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <functional>

#include "process_group.h"
#include "pushpull/build_info.h"

namespace py = pybind11;
using pushpull::torch_pg::ProcessGroupPushpull;

namespace {

c10::intrusive_ptr<ProcessGroupPushpull> create(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                std::chrono::milliseconds timeout) {
  py::gil_scoped_release no_gil;  // the rendezvous blocks
  return c10::make_intrusive<ProcessGroupPushpull>(store, rank, size, timeout);
}

}  // namespace

PYBIND11_MODULE(_pushpull_torch_pg, m) {
  m.doc() = "pushpull's torch.distributed backend (use pushpull.torch.distributed)";
  // Shutting a group down joins its completer thread, which may be running a
  // Python future callback that needs the GIL: release it meanwhile.
  ProcessGroupPushpull::set_blocking_region([](const std::function<void()>& body) {
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      body();
    } else {
      body();
    }
  });

  py::object base = py::module_::import("torch.distributed").attr("ProcessGroup");
  py::class_<ProcessGroupPushpull, c10::intrusive_ptr<ProcessGroupPushpull>>(
      m, "ProcessGroupPushpull", base,
      "A torch.distributed process group over pushpull's collectives engine.")
      .def(py::init(&create), py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout"))
      .def_static("create", &create, py::arg("store"), py::arg("rank"), py::arg("size"),
                  py::arg("timeout"),
                  "The creator torch.distributed.Backend.register_backend takes: "
                  "(store, rank, world_size, timeout) -> ProcessGroup.")
      .def("shutdown", &ProcessGroupPushpull::shutdown,
           "Leaves the group now (local; peers with pending ops see PeerFailure).")
      .def_property_readonly("mode", &ProcessGroupPushpull::mode,
                             "How the group met: 'rendezvous' or 'single'.");

  // Facts of this build, checked against the running torch at import.
  m.attr("__version__") = PUSHPULL_VERSION;
  m.attr("torch_version") =
      py::make_tuple(TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
  m.attr("cxx11_abi") = static_cast<bool>(_GLIBCXX_USE_CXX11_ABI);
  m.attr("pybind11_abi") =
      py::make_tuple(PYBIND11_COMPILER_TYPE, PYBIND11_STDLIB, PYBIND11_BUILD_ABI);
}
