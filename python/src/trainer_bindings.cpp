// SPDX-License-Identifier: Apache-2.0
// bind_trainer: `_pushpull.TrainerCore`, the Trainers' step
// (include/pushpull/frontend/trainer_core.h) for pushpull.torch.Trainer,
// which keeps only the torch glue (its checks and messages, the autograd
// hooks, a torch optimizer's update).
//
// Why these choices:
// - The weights are pinned once, at construction (the Trainer owns the
//   parameters, whose storage must not change; the Python Trainer always
//   bound them then). A gradient is pinned when the core reads it, and the
//   pins stay until the step that collects its exchange is over; when that
//   step failed with an exchange still running, they are parked until the
//   core has nothing in flight (bindings.h, park_until_done).
// - The core and its glue live in one shared State: the parking lot may
//   hold it after the Python object is gone. The Python callables it keeps
//   (gradient, batch_changed) must not reference the Trainer, or Python's
//   collector could never free it (a cycle through C++).
// - Every blocking store call runs with the GIL released (Glue::blocking);
//   the core calls it holding none of its locks.
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "pushpull/frontend/trainer_core.h"

namespace pushpull::python {
namespace {

using frontend::TrainerCore;

struct Glue final : frontend::TrainerTensors {
  py::object store;       // keeps the _pushpull.KVStore alive
  std::vector<Pinned> w;  // parameter i's weights
  py::object grad;        // grad(i) -> parameter i's gradient, checked (raises)
  py::object changed;     // changed(batch, first_batch): the warning
  KeepAlive pins;         // gradients read this round (GIL)

  ArrayView weight(size_t i, int /*d*/) override { return w.at(i).view; }
  ArrayView gradient(size_t i, int /*d*/) override {  // GIL held: hooks and step()
    Pinned p = pin(grad(i), /*writable=*/false, fmt::format("Trainer: gradient {}", i));
    pins.push_back(std::move(p.keep_alive));
    return p.view;
  }
  void blocking(const std::function<void()>& call) override {
    py::gil_scoped_release nogil;
    call();
  }
  void batch_changed(int64_t batch, int64_t first_batch, int /*workers*/) override {
    changed(batch, first_batch);
  }
};

struct State {
  Glue glue;  // before core: it outlives it
  std::unique_ptr<TrainerCore> core;
};

class PyTrainer {
 public:
  PyTrainer(py::object store, const py::list& weights, py::object grad, py::object changed,
            const std::string& name, const std::map<std::string, double>& hp,
            frontend::TrainerCoreOptions o)
      : s_(std::make_shared<State>()) {
    std::vector<Shape> shapes;
    for (size_t i = 0; i < weights.size(); ++i) {
      s_->glue.w.push_back(
          pin(weights[i], /*writable=*/true, fmt::format("Trainer: weight {}", i)));
      shapes.push_back(s_->glue.w.back().view.shape);
    }
    s_->glue.grad = std::move(grad);
    s_->glue.changed = std::move(changed);
    auto getter = store_getter(store);
    s_->glue.store = std::move(store);
    s_->core = std::make_unique<TrainerCore>(std::move(getter), OptimizerSpec{name, hp},
                                             std::move(shapes), 1, o, s_->glue);
  }

  TrainerCore& core() { return *s_->core; }

  void init() {
    settle([&] { s_->core->init(); });
  }
  void step(int64_t batch) {
    settle([&] { s_->core->step(batch); });
  }
  const char* grad_ready(size_t i) {
    using Ready = frontend::PushSchedule::Ready;
    const Ready r = s_->core->grad_ready(i);
    return r == Ready::kPush ? "push" : r == Ready::kSecond ? "second" : "wait";
  }

  // local_optimizer = false: parameter i's summed gradient, a numpy array
  // over the core's buffer that keeps the core alive.
  py::array summed(size_t i) {
    const ArrayView v = s_->core->summed(i);
    std::vector<py::ssize_t> shape(v.shape.dims().begin(), v.shape.dims().end());
    auto* keep = new std::shared_ptr<State>(s_);
    py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<State>*>(p); });
    return py::array(py::dtype::of<float>(), shape, {}, v.data, base);
  }

 private:
  // Runs a step (or init); afterwards the round's gradients are released,
  // or parked while an exchange of a failed step may still read them.
  template <typename F>
  void settle(F&& f) {
    try {
      f();
    } catch (...) {
      release_pins();
      throw;
    }
    release_pins();
  }
  void release_pins() {
    KeepAlive keep = std::move(s_->glue.pins);
    s_->glue.pins.clear();
    if (keep.empty()) return;
    if (!s_->core->in_flight()) return;  // `keep` dropped here, GIL held
    auto s = s_;
    park_until_done([s] { return !s->core->in_flight(); }, std::move(keep));
  }

  std::shared_ptr<State> s_;
};

}  // namespace

void bind_trainer(py::module_& m) {
  py::class_<PyTrainer>(m, "TrainerCore",
                        "The Trainers' step (frontend/trainer_core.h); pushpull.torch.Trainer "
                        "is the API.")
      .def(py::init([](py::object store, const py::list& weights, py::object grad,
                       py::object changed, const std::string& name,
                       const std::map<std::string, double>& hp, bool update_on_kvstore,
                       bool push_from_hooks, int64_t key_base, int64_t fuse_below,
                       int64_t bucket_bytes, bool local_optimizer) {
             return std::make_unique<PyTrainer>(
                 std::move(store), weights, std::move(grad), std::move(changed), name, hp,
                 frontend::TrainerCoreOptions{.update_on_kvstore = update_on_kvstore,
                                              .push_from_hooks = push_from_hooks,
                                              .key_base = key_base,
                                              .fuse_below = fuse_below,
                                              .bucket_bytes = bucket_bytes,
                                              .local_optimizer = local_optimizer});
           }),
           py::arg("store"), py::arg("weights"), py::arg("gradient"), py::arg("batch_changed"),
           py::arg("optimizer"), py::arg("hyperparameters"), py::arg("update_on_kvstore"),
           py::arg("push_from_hooks"), py::arg("key_base"), py::arg("fuse_below"),
           py::arg("bucket_bytes"), py::arg("local_optimizer"))
      .def_property_readonly("keys",
                             [](PyTrainer& t) {
                               std::vector<int64_t> keys;
                               for (const auto& u : t.core().units())
                                 keys.push_back(u.key);
                               return keys;
                             })
      .def(
          "key_of",
          [](PyTrainer& t, size_t i) { return t.core().units()[t.core().unit_of(i)].key; },
          "Parameter i's key (its packed unit's).")
      .def("init", &PyTrainer::init, "Stores worker 0's weights and pulls them (idempotent).")
      .def("step", &PyTrainer::step, py::arg("batch_size"))
      .def("grad_ready", &PyTrainer::grad_ready,
           "A hook saw parameter i's gradient: 'push' (its key's exchange started), 'second' "
           "(one too many this round) or 'wait'.")
      .def("summed", &PyTrainer::summed)
      .def("stats", [](PyTrainer& t) {
        const auto s = t.core().stats();
        py::dict d;
        d["steps"] = s.steps;
        d["hook_pushes"] = s.hook_pushes;
        d["step_pushes"] = s.step_pushes;
        d["wait_seconds"] = s.wait_seconds;
        return d;
      });
}

}  // namespace pushpull::python
