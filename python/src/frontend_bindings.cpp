// SPDX-License-Identifier: Apache-2.0
// bind_frontend: the torch front ends' policy (include/pushpull/frontend/),
// which the libtorch integration binds too:
// - `_pushpull.collective.GradientReducer`: the DistributedOptimizer's
//   (gradient_reducer.h), over the process-default session;
//   python/pushpull/torch/optimizer.py keeps only the torch glue (hooks,
//   tensors, sparse gradients, Horovod's warnings);
// (The Trainers' step, keys and hooks' pushes: trainer_bindings.cpp.)
//
// Why these choices:
// - A gradient given to submit() is pinned (bindings.h) until synchronize()
//   has written its result, so dropping the last Python reference cannot free
//   memory the engine writes. When synchronize() fails while a reduction may
//   still run (a Timeout), or the reducer is dropped mid-step, the pins are
//   parked until the reductions are over.
// - synchronize() releases the GIL while it waits; it holds no lock of the
//   reducer meanwhile, so autograd hooks on other threads keep running.
// - The communicator is looked up at every call (the default session of the
//   moment: an elastic job re-forms it).
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "pushpull/collective.h"
#include "pushpull/frontend/gradient_reducer.h"

namespace pushpull::python {
namespace {

namespace coll = pushpull::collective;
using frontend::GradCompression;
using frontend::GradientReducer;

GradCompression compression_of(const std::string& name) {
  if (name == "none") return GradCompression::kNone;
  if (name == "fp16") return GradCompression::kFp16;
  if (name == "2bit") return GradCompression::kTwoBit;
  if (name == "1bit") return GradCompression::kOneBit;
  throw InvalidArgument(
      fmt::format("GradientReducer: compression must be none, fp16, 2bit or 1bit, got '{}'", name));
}

class PyReducer {
 public:
  PyReducer(std::vector<std::string> names, frontend::ReducerOptions o)
      : core_(std::make_shared<GradientReducer>(
            []() -> coll::Communicator& { return coll::default_session().communicator(); }, names,
            std::move(o))),
        pins_(names.size()) {}

  ~PyReducer() {  // GIL held
    if (pinned() == 0) return;
    park_pins();
  }

  GradientReducer& core() { return *core_; }

  void submit(size_t i, py::object grad) {
    Pinned p = pin(grad, /*writable=*/true,
                   fmt::format("{} gradient of '{}'", core_->options().who, core_->name(i)));
    core_->submit(i, p.view);
    pins_.at(i) = std::move(p.keep_alive);
  }

  // An elastic reset: the round ends without waiting; the pins stay until
  // the old session's operations are over.
  void abandon() {
    core_->abandon_round();
    park_pins();
  }

  double synchronize() {
    // The gradients pinned now are the ones this synchronize() waits for; a
    // hook on another thread may submit more while the GIL is released: their
    // pins stay for the next synchronize().
    std::vector<size_t> mine;
    for (size_t i = 0; i < pins_.size(); ++i)
      if (pins_[i]) mine.push_back(i);
    double waited = 0;
    try {
      py::gil_scoped_release nogil;
      waited = core_->synchronize();
    } catch (...) {
      KeepAlive keep = take_pins(mine);
      if (core_->in_flight()) {
        auto core = core_;
        park_until_done([core] { return !core->in_flight(); }, std::move(keep));
      }
      throw;
    }
    take_pins(mine);
    return waited;
  }

 private:
  // Hands the pinned gradients to a parked holder that drops them once the
  // core has nothing in flight (without blocking the caller).
  void park_pins() {
    auto core = core_;
    park_until_done(
        [core] {
          try {
            return !core->in_flight();
          } catch (...) {
            return true;  // the session is gone: its ops failed
          }
        },
        take_pins());
  }
  size_t pinned() const {
    size_t n = 0;
    for (const auto& p : pins_)
      n += p ? 1 : 0;
    return n;
  }
  // The pins of `which` (every parameter by default), moved out.
  KeepAlive take_pins(const std::vector<size_t>& which) {
    KeepAlive out;
    for (size_t i : which)
      if (pins_.at(i)) out.push_back(std::move(pins_[i]));
    for (size_t i : which)
      pins_[i] = py::object();
    return out;
  }
  KeepAlive take_pins() {
    std::vector<size_t> all(pins_.size());
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = i;
    return take_pins(all);
  }

  std::shared_ptr<GradientReducer> core_;
  std::vector<py::object> pins_;  // by parameter (GIL)
};

}  // namespace

void bind_frontend(py::module_& m) {
  if (!py::hasattr(m, "collective")) return;  // built without the collective bindings
  py::module_ c = m.attr("collective");
  py::class_<PyReducer>(c, "GradientReducer",
                        "The DistributedOptimizer's policy (frontend/gradient_reducer.h) over the "
                        "default session; pushpull.torch.DistributedOptimizer is the API.")
      .def(py::init([](std::vector<std::string> names, std::vector<int> members,
                       std::string name_prefix, coll::Reduction op, int passes, double predivide,
                       const std::string& compression, float threshold,
                       std::vector<std::vector<size_t>> groups, int num_groups) {
             frontend::ReducerOptions o;
             o.backward_passes_per_step = passes;
             o.op = op;
             o.name_prefix = std::move(name_prefix);
             o.compression = compression_of(compression);
             o.compression_threshold = threshold;
             o.process_set = std::move(members);
             o.gradient_predivide_factor = predivide;
             o.groups = std::move(groups);
             o.num_groups = num_groups;
             o.reduce_alone = false;  // Horovod's: a set of one steps locally
             return std::make_unique<PyReducer>(std::move(names), std::move(o));
           }),
           py::arg("names"), py::arg("members"), py::arg("name_prefix"), py::arg("op"),
           py::arg("backward_passes_per_step"), py::arg("gradient_predivide_factor"),
           py::arg("compression"), py::arg("threshold"), py::arg("groups"), py::arg("num_groups"))
      .def_property_readonly("active", [](PyReducer& r) { return r.core().active(); })
      .def_property_readonly("members", [](PyReducer& r) { return r.core().members(); })
      .def_property_readonly("pending", [](PyReducer& r) { return r.core().pending(); })
      .def("before_accumulate", [](PyReducer& r, size_t i) { r.core().before_accumulate(i); })
      .def("grad_ready", [](PyReducer& r, size_t i) { return r.core().grad_ready(i); })
      .def("take_unsubmitted", [](PyReducer& r) { return r.core().take_unsubmitted(); })
      .def("hand_back", [](PyReducer& r, size_t i) { r.core().hand_back(i); })
      .def("finish_external", [](PyReducer& r, size_t i) { r.core().finish_external(i); })
      .def("submit", &PyReducer::submit, py::arg("index"), py::arg("grad"),
           "Starts the reduction of parameter index's gradient (pinned until synchronize()).")
      .def("abandon", &PyReducer::abandon,
           "Ends the round without waiting (elastic reset); the gradients stay pinned until "
           "the old operations are over.")
      .def("synchronize", &PyReducer::synchronize,
           "Waits (GIL released) for every reduction and writes the results into the "
           "submitted gradients; returns the seconds waited.")
      .def("stats", [](PyReducer& r) {
        const auto s = r.core().stats();
        py::dict d;
        d["hook_reductions"] = s.hook_reductions;
        d["sync_reductions"] = s.sync_reductions;
        d["wait_seconds"] = s.wait_seconds;
        return d;
      });
}

}  // namespace pushpull::python
