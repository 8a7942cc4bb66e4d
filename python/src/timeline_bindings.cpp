// SPDX-License-Identifier: Apache-2.0
// pushpull._pushpull.timeline: a program's own spans on the process's
// timeline (docs/timeline.md, "Your own phases"), next to the engine's.
// python/pushpull/timeline.py is the public face.
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "bindings.h"
#include "pushpull/error.h"
#include "pushpull/timeline.h"

namespace pushpull::python {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

Clock::time_point at_ns(int64_t ns) {
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

}  // namespace

void bind_timeline(py::module_& m) {
  py::module_ t = m.def_submodule("timeline", "spans of the program's own on the timeline");
  t.def(
      "enabled", [] { return timeline_enabled(); },
      "True when this process records a timeline (PUSHPULL_TIMELINE / HOROVOD_TIMELINE).");
  t.def("now", &now_ns,
        "The timeline's clock (steady, the same in every process of a host), in nanoseconds.");
  t.def(
      "process_node", [] { return timeline_process_node(); },
      "This process's node name from the launcher's variables ('worker 0', 'rank 1', ...).");
  t.def(
      "span",
      [](const std::string& node, const std::string& lane, const std::string& name,
         int64_t begin_ns, int64_t end_ns) {
        if (end_ns < begin_ns) throw InvalidArgument("timeline span ends before it begins");
        timeline_span(node, lane, name, at_ns(begin_ns), at_ns(end_ns));
      },
      py::arg("node"), py::arg("lane"), py::arg("name"), py::arg("begin_ns"), py::arg("end_ns"),
      "Records a span (times from now()) on lane `lane` of node `node`; nothing when off.");
}

}  // namespace pushpull::python
