// SPDX-License-Identifier: Apache-2.0
// _pushpull.KVStore, _pushpull.KVHandle and the optimizer helpers behind
// pushpull.kv and pushpull.optimizer. These take normalised arguments (a list
// of keys, a list of per-device array lists per key); kv.py applies MXNet's
// calling conventions on top.
//
// GIL: arrays are pinned with the GIL held, then every store call that may
// block runs with the GIL released. Async calls return a KVHandle that owns
// the pinned arrays until the operation is done (its destructor waits first,
// so collecting a handle early can never free memory the store still uses;
// if that wait, or a synchronous call's, times out, the arrays are parked
// until the operation is over: see park_until_done in bindings.h).
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "pushpull/error.h"
#include "pushpull/kvstore.h"
#include "pushpull/optimizer.h"
#include "pushpull/options.h"

namespace pushpull::python {
namespace {

Key to_key(py::handle k) {
  if (py::isinstance<py::str>(k)) return Key(k.cast<std::string>());
  if (py::isinstance<py::int_>(k) && !py::isinstance<py::bool_>(k)) return Key(k.cast<int64_t>());
  throw InvalidArgument(
      fmt::format("a key must be an int or a str, got {} ({}); use the same kind "
                  "of key for every value of a store",
                  py::repr(k).cast<std::string>(),
                  py::type::handle_of(k).attr("__name__").cast<std::string>()));
}

std::vector<Key> to_keys(const py::sequence& keys) {
  std::vector<Key> out;
  out.reserve(keys.size());
  for (py::handle k : keys)
    out.push_back(to_key(k));
  return out;
}

// Pins a list (per key) of lists (per device) of arrays.
struct PinnedLists {
  std::vector<ArrayList> views;
  KeepAlive keep;
};

PinnedLists pin_lists(const py::sequence& lists, const std::vector<Key>& keys, bool writable,
                      const char* op, const char* role) {
  if (lists.size() != keys.size())
    throw InvalidArgument(fmt::format("{}: {} keys but {} {} lists; give one list per key", op,
                                      keys.size(), lists.size(), role));
  PinnedLists p;
  p.views.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    py::sequence devices = py::reinterpret_borrow<py::sequence>(lists[i]);
    for (size_t d = 0; d < devices.size(); ++d) {
      Pinned a = pin(devices[d], writable,
                     fmt::format("{}: {} {} for key {}", op, role, d, keys[i].to_string()));
      p.views[i].push_back(a.view);
      p.keep.push_back(std::move(a.keep_alive));
    }
  }
  return p;
}

// An asynchronous operation and the arrays it uses.
class PyHandle {
 public:
  PyHandle(KVHandle h, KeepAlive keep, Millis timeout)
      : h_(std::move(h)), keep_(std::move(keep)), timeout_(timeout) {}
  PyHandle(const PyHandle&) = delete;
  PyHandle& operator=(const PyHandle&) = delete;
  ~PyHandle() {
    if (!h_.done()) {
      py::gil_scoped_release release;
      try {
        h_.wait(timeout_);
      } catch (const std::exception&) {  // the error was the caller's to collect
      }
    }
    // Still running after that (the wait timed out): the network may still
    // read or write the arrays, so they outlive this handle in the parking lot.
    KVHandle h = h_;
    park_until_done([h] { return h.done(); }, std::move(keep_));
  }
  bool done() const { return h_.done(); }
  void wait() {
    {
      py::gil_scoped_release release;
      h_.wait(timeout_);
    }
    keep_.clear();
  }

 private:
  KVHandle h_;
  KeepAlive keep_;
  Millis timeout_;
};

// Starts an operation (`start` runs with the GIL released and returns its
// handle); a synchronous call also waits for it. If starting or waiting
// throws (a Timeout) while the operation may still use the arrays, they are
// parked until it is over instead of being released with `keep`.
template <typename Start>
std::optional<PyHandle*> run_op(KVStore& store, KeepAlive keep, bool async, Start start) {
  KVHandle h;
  try {
    py::gil_scoped_release release;
    h = start();
    if (!async) store.wait(h);
  } catch (...) {
    park_until_done([h] { return h.done(); }, std::move(keep));
    throw;
  }
  release_finished();
  if (!async) return std::nullopt;
  return new PyHandle(std::move(h), std::move(keep), store.wait_timeout());
}

// Owns the store; destroying it may block (a dist store meets the servers at
// a final barrier), so it happens with the GIL released.
class PyStore {
 public:
  explicit PyStore(std::unique_ptr<KVStore> s) : s_(std::move(s)) {}
  ~PyStore() { close(); }
  void close() {
    if (!s_) return;
    py::gil_scoped_release release;
    s_.reset();
  }
  KVStore& get() const {
    if (!s_) throw InvalidArgument("this KVStore was closed; create a new one with kv.create()");
    return *s_;
  }

 private:
  std::unique_ptr<KVStore> s_;
};

// A Python updater(key, input, stored) called on the store's threads. The
// function object is released under the GIL whichever thread drops it.
Updater python_updater(py::function fn) {
  auto holder = std::shared_ptr<py::function>(new py::function(std::move(fn)), [](py::function* f) {
    py::gil_scoped_acquire gil;
    delete f;
  });
  return [holder](const Key& key, const ArrayView& summed, const ArrayView& stored) {
    py::gil_scoped_acquire gil;
    auto as_numpy = [](const ArrayView& v, bool writable) {
      py::dtype dt;
      switch (v.dtype) {
        case DType::kFloat32:
          dt = py::dtype::of<float>();
          break;
        case DType::kFloat64:
          dt = py::dtype::of<double>();
          break;
        case DType::kFloat16:
          dt = py::dtype("float16");
          break;
        case DType::kInt32:
          dt = py::dtype::of<int32_t>();
          break;
        case DType::kInt64:
          dt = py::dtype::of<int64_t>();
          break;
        case DType::kInt8:
          dt = py::dtype::of<int8_t>();
          break;
        case DType::kUInt8:
          dt = py::dtype::of<uint8_t>();
          break;
        case DType::kBFloat16:
          throw InvalidArgument(
              "a Python updater cannot take bfloat16 values (numpy has no "
              "bfloat16); use set_optimizer or float32 values");
      }
      std::vector<py::ssize_t> shape(v.shape.dims().begin(), v.shape.dims().end());
      // A base object that frees nothing: the array aliases the store's
      // memory (no copy) and lives only for the call.
      py::array a(dt, shape, {}, v.data, py::capsule(v.data, [](void*) {}));
      if (!writable) a.attr("setflags")(py::arg("write") = false);
      return a;
    };
    py::object k =
        key.is_int() ? py::object(py::int_(key.as_int())) : py::object(py::str(key.as_string()));
    try {
      (*holder)(k, as_numpy(summed, false), as_numpy(stored, true));
    } catch (py::error_already_set& e) {
      throw InvalidArgument(
          fmt::format("the updater raised for key {}: {}", key.to_string(), e.what()));
    }
  };
}

Environment environment(const std::optional<std::map<std::string, std::string>>& overrides) {
  Environment env = Environment::current();
  if (overrides)
    for (const auto& [k, v] : *overrides)
      env.set(k, v);
  return env;
}

}  // namespace

std::function<KVStore&()> store_getter(py::handle store) {
  const PyStore* s = &store.cast<const PyStore&>();
  return [s]() -> KVStore& { return s->get(); };
}

void bind_kv(py::module_& m) {
  py::class_<PyHandle>(m, "KVHandle",
                       "An asynchronous KVStore operation; keeps its arrays alive until done.")
      .def("wait", &PyHandle::wait, "Blocks until done (GIL released); raises its error.")
      .def("done", &PyHandle::done);

  py::class_<PyStore>(m, "KVStore", "A pushpull KVStore (see pushpull.kv for the MXNet API).")
      .def("close", &PyStore::close, "Waits for pending work and leaves the job (dist stores).")
      .def_property_readonly("type", [](const PyStore& s) { return s.get().type(); })
      .def_property_readonly("rank", [](const PyStore& s) { return s.get().rank(); })
      .def_property_readonly("num_workers", [](const PyStore& s) { return s.get().num_workers(); })
      .def_property_readonly("restart_round",
                             [](const PyStore& s) { return s.get().restart_round(); })
      .def("init",
           [](PyStore& s, const py::sequence& keys, const py::sequence& values) {
             std::vector<Key> ks = to_keys(keys);
             if (values.size() != ks.size())
               throw InvalidArgument(
                   fmt::format("init: {} keys but {} values", ks.size(), values.size()));
             std::vector<ArrayView> views;
             KeepAlive keep;
             for (size_t i = 0; i < ks.size(); ++i) {
               Pinned p =
                   pin(values[i], false, fmt::format("init: value for key {}", ks[i].to_string()));
               views.push_back(p.view);
               keep.push_back(std::move(p.keep_alive));
             }
             py::gil_scoped_release release;
             s.get().init(ks, views);
           })
      .def(
          "push",
          [](PyStore& s, const py::sequence& keys, const py::sequence& values, int priority,
             bool async) -> std::optional<PyHandle*> {
            std::vector<Key> ks = to_keys(keys);
            PinnedLists v = pin_lists(values, ks, false, "push", "value");
            return run_op(s.get(), std::move(v.keep), async,
                          [&] { return s.get().push_async(ks, v.views, priority); });
          },
          py::arg("keys"), py::arg("values"), py::arg("priority") = 0, py::arg("async_") = false,
          py::return_value_policy::take_ownership)
      .def(
          "pull",
          [](PyStore& s, const py::sequence& keys, const py::sequence& outs, int priority,
             bool async) -> std::optional<PyHandle*> {
            std::vector<Key> ks = to_keys(keys);
            PinnedLists o = pin_lists(outs, ks, true, "pull", "output");
            return run_op(s.get(), std::move(o.keep), async,
                          [&] { return s.get().pull_async(ks, o.views, priority); });
          },
          py::arg("keys"), py::arg("outs"), py::arg("priority") = 0, py::arg("async_") = false,
          py::return_value_policy::take_ownership)
      .def(
          "pushpull",
          [](PyStore& s, const py::sequence& keys, const py::sequence& values,
             const py::sequence& outs, int priority, bool async) -> std::optional<PyHandle*> {
            std::vector<Key> ks = to_keys(keys);
            PinnedLists v = pin_lists(values, ks, false, "pushpull", "value");
            PinnedLists o = pin_lists(outs, ks, true, "pushpull", "output");
            for (auto& k : o.keep)
              v.keep.push_back(std::move(k));
            return run_op(s.get(), std::move(v.keep), async,
                          [&] { return s.get().pushpull_async(ks, v.views, o.views, priority); });
          },
          py::arg("keys"), py::arg("values"), py::arg("outs"), py::arg("priority") = 0,
          py::arg("async_") = false, py::return_value_policy::take_ownership)
      .def(
          "row_sparse_pull",
          [](PyStore& s, py::handle key, const py::sequence& outs, py::handle row_ids,
             int priority) {
            std::vector<Key> ks{to_key(key)};
            PinnedLists o = pin_lists(py::make_tuple(outs), ks, true, "row_sparse_pull", "output");
            Pinned rows =
                pin(row_ids, false,
                    fmt::format("row_sparse_pull: row_ids for key {}", ks[0].to_string()));
            o.keep.push_back(std::move(rows.keep_alive));
            run_op(s.get(), std::move(o.keep), false, [&] {
              return s.get().row_sparse_pull_async(ks[0], o.views[0], rows.view, priority);
            });
          },
          py::arg("key"), py::arg("outs"), py::arg("row_ids"), py::arg("priority") = 0)
      .def("wait_all",
           [](PyStore& s) {
             py::gil_scoped_release release;
             s.get().wait_all();
           })
      .def("barrier",
           [](PyStore& s) {
             py::gil_scoped_release release;
             s.get().barrier();
           })
      .def(
          "set_optimizer",
          [](PyStore& s, const std::string& name, const std::map<std::string, double>& hp) {
            OptimizerSpec spec{name, hp};
            py::gil_scoped_release release;
            s.get().set_optimizer(spec);
          },
          py::arg("name"), py::arg("hyperparameters"))
      .def("set_updater",
           [](PyStore& s, std::optional<py::function> fn) {
             Updater u = fn ? python_updater(std::move(*fn)) : Updater{};
             py::gil_scoped_release release;
             s.get().set_updater(std::move(u));
           })
      .def("set_gradient_compression",
           [](PyStore& s, const std::map<std::string, std::string>& params) {
             py::gil_scoped_release release;
             s.get().set_gradient_compression(params);
           })
      .def("save_optimizer_states",
           [](PyStore& s, const std::string& path) {
             py::gil_scoped_release release;
             s.get().save_optimizer_states(path);
           })
      .def("load_optimizer_states", [](PyStore& s, const std::string& path) {
        py::gil_scoped_release release;
        s.get().load_optimizer_states(path);
      });

  m.def(
      "create_kvstore",
      [](const std::string& type, const std::optional<std::map<std::string, std::string>>& env) {
        Options options = Options::from_env(environment(env));
        std::unique_ptr<KVStore> store;
        {
          // A dist store registers with the scheduler and meets the others.
          py::gil_scoped_release release;
          store = create_kvstore(type, options);
        }
        return std::make_unique<PyStore>(std::move(store));
      },
      py::arg("type"), py::arg("env") = py::none(),
      "Makes a store of `type`, configured from the environment (plus `env` overrides).");
  m.def("kvstore_types", &kvstore_types);
  m.def("optimizer_names", &optimizer_names);
  m.def(
      "optimizer_spec",
      [](const std::string& name, const std::map<std::string, double>& hp) {
        auto opt = create_optimizer(OptimizerSpec{name, hp});
        return py::make_tuple(opt->spec().name, opt->spec().hyperparameters);
      },
      py::arg("name"), py::arg("hyperparameters"),
      "Checks an optimizer spec; returns (name, every hyperparameter with defaults filled in).");
  m.def("parse_optimizer_spec", [](const std::string& text) {
    OptimizerSpec s = OptimizerSpec::parse(text);
    return py::make_tuple(s.name, s.hyperparameters);
  });
}

}  // namespace pushpull::python
