// SPDX-License-Identifier: Apache-2.0
// bind_elastic: `_pushpull.elastic`, what pushpull.torch.elastic needs from
// the C++ side of an elastic job (src/collective/elastic_client.h): whether
// this process is an elastic worker, the round it is in, and the launcher's
// host-change stamps. The re-formation itself is collective.shutdown() +
// collective.init() (the bootstrap asks the launcher for the next round).
//
// Threading: the functions only read the process-wide client's counters
// (thread-safe); none blocks.
#include "bindings.h"
#include "pushpull/elastic.h"

namespace pushpull::python {

void bind_elastic_state(py::module_& m);  // elastic_state_bindings.cpp: State and run

void bind_elastic(py::module_& parent) {
  namespace ce = pushpull::collective::elastic;
  py::module_ m = parent.def_submodule("elastic", "Elastic jobs (pushpull.torch.elastic)");
  m.def(
      "is_elastic", [] { return ce::is_elastic_worker(); },
      "True when the launcher started this process as an elastic worker.");
  m.def(
      "hosts_stamp", [] { return ce::announced_hosts_stamp(); },
      "The newest host-change stamp the launcher announced (0: none).");
  m.def(
      "round_hosts_stamp", [] { return ce::round_hosts_stamp(); },
      "The host-change stamp the current round already includes.");
  m.def(
      "round", [] { return ce::current_round(); },
      "The current round (0: not an elastic worker or not joined yet).");
  bind_elastic_state(m);
}

}  // namespace pushpull::python
