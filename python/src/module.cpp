// SPDX-License-Identifier: Apache-2.0
// The `pushpull._pushpull` extension module: one bind_* call per part
// (bindings.h). The pure-Python package (python/pushpull/) is the public face.
#include "bindings.h"
#include "pushpull/build_info.h"

PYBIND11_MODULE(_pushpull, m) {
  m.doc() = "pushpull's C++ core (use the `pushpull` package)";
  m.attr("__version__") = PUSHPULL_VERSION;
  m.attr("build_info") = PUSHPULL_BUILD_TYPE " " PUSHPULL_COMPILER " " PUSHPULL_BUILD_FEATURES;
  pushpull::python::bind_errors(m);
  pushpull::python::bind_arrays(m);
  pushpull::python::bind_kv(m);
  pushpull::python::bind_parking(m);
  pushpull::python::bind_timeline(m);
  pushpull::python::bind_compression(m);
#ifdef PUSHPULL_PYTHON_COLLECTIVE
  pushpull::python::bind_collective(m);
  pushpull::python::bind_elastic(m);
#endif
  pushpull::python::bind_frontend(m);
  pushpull::python::bind_trainer(m);
}
