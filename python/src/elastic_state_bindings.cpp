// SPDX-License-Identifier: Apache-2.0
// bind_elastic_state: Horovod's elastic state machine of include/pushpull/elastic.h
// (State: commit, check_host_updates, reset callbacks; run: restore on a
// member's failure, re-form, sync) as `_pushpull.elastic.State` and
// `_pushpull.elastic.run`, so pushpull.torch.elastic and the libtorch
// elastic API run the one loop; Python keeps only its save/restore/sync of
// torch objects (python/pushpull/torch/elastic.py).
//
// Why these choices:
// - The loop tells a member's failure (PeerFailure) from a host change
//   (HostsUpdatedInterrupt) by their C++ types, so a Python exception out of
//   the training function, a reset or an override becomes the C++ one
//   again (call_py); a C++ HostsUpdatedInterrupt reaches Python as
//   pushpull.torch.elastic.HostsUpdatedInterrupt (with skip_sync).
// - run() releases the GIL; every call back into Python takes it again, so
//   the collectives of check_host_updates never block other Python threads.
// - The state agrees through the default session of the moment (re-formed
//   by each reset).
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <functional>
#include <string>
#include <vector>

#include "bindings.h"
#include "pushpull/collective.h"
#include "pushpull/elastic.h"
#include "pushpull/error.h"

namespace pushpull::python {
namespace {

namespace ce = pushpull::collective::elastic;
namespace coll = pushpull::collective;

py::object python_interrupt_class() {
  return py::module_::import("pushpull.torch.elastic").attr("HostsUpdatedInterrupt");
}

// Runs Python code (GIL taken), turning a member's failure and a host change
// raised in Python into the C++ exceptions run() tells apart.
template <typename F>
void call_py(F&& f) {
  py::gil_scoped_acquire gil;
  try {
    f();
  } catch (py::error_already_set& e) {
    if (e.matches(py::module_::import("pushpull._pushpull").attr("PeerFailure")))
      throw PeerFailure(py::str(e.value()).cast<std::string>());
    if (e.matches(python_interrupt_class()))
      throw ce::HostsUpdatedInterrupt(e.value().attr("skip_sync").cast<bool>());
    throw;
  }
}

class PyState : public ce::State {
 public:
  PyState()
      : State([]() -> coll::Communicator& { return coll::default_session().communicator(); }) {}
  void save() override {
    call_py([&] { PYBIND11_OVERRIDE_PURE(void, ce::State, save); });
  }
  void restore() override {
    call_py([&] { PYBIND11_OVERRIDE_PURE(void, ce::State, restore); });
  }
  void sync() override {
    call_py([&] { PYBIND11_OVERRIDE_PURE(void, ce::State, sync); });
  }
};

void translate_interrupt(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const ce::HostsUpdatedInterrupt& e) {
    py::object err = python_interrupt_class()(e.skip_sync());
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
  }
}

}  // namespace

void bind_elastic_state(py::module_& m) {
  py::register_exception_translator(&translate_interrupt);
  using Release = py::call_guard<py::gil_scoped_release>;
  py::class_<ce::State, PyState>(m, "State",
                                 "Horovod's State (include/pushpull/elastic.h); subclasses "
                                 "implement save, restore and sync.")
      .def(py::init<>())
      .def("commit", &ce::State::commit, Release(),
           "save(), then check_host_updates() (collective).")
      .def("check_host_updates", &ce::State::check_host_updates, Release(),
           "Raises HostsUpdatedInterrupt on every rank once any saw a host change (collective).")
      .def(
          "register_reset_callbacks",
          [](ce::State& s, std::vector<py::function> callbacks) {
            std::vector<std::function<void()>> wrapped;
            for (auto& cb : callbacks) {
              // Owned with the GIL: the wrapper may be destroyed without it.
              auto held = std::make_shared<py::function>(std::move(cb));
              wrapped.push_back([held] { call_py([&] { (*held)(); }); });
            }
            s.register_reset_callbacks(std::move(wrapped));
          },
          "Callbacks run after every re-formation, in registration order.")
      .def("on_reset", &ce::State::on_reset, Release())
      .def(
          "on_hosts_updated",
          [](ce::State& s, uint64_t stamp, const py::object&) {
            if (stamp > 0) s.on_hosts_updated(stamp);
          },
          py::arg("timestamp"), py::arg("update_res") = py::none());
  m.def(
      "run",
      [](ce::State& state, const py::function& fn, const py::function& reset) {
        py::gil_scoped_release nogil;
        ce::run(
            state, [&] { call_py([&] { fn(); }); }, [&] { call_py([&] { reset(); }); });
      },
      py::arg("state"), py::arg("fn"), py::arg("reset"),
      "Horovod's elastic loop over `state`: fn() until it returns; restore on a member's "
      "failure, re-form with reset(), reset callbacks, sync (include/pushpull/elastic.h).");
}

}  // namespace pushpull::python
