// SPDX-License-Identifier: Apache-2.0
// The parking lot of bindings.h: arrays of operations whose wait timed out or
// whose handle went away early, kept until the operation is over.
#include <functional>
#include <utility>
#include <vector>

#include "bindings.h"

namespace pushpull::python {
namespace {

struct Parked {
  std::function<bool()> done;
  KeepAlive keep;
};

// Touched only with the GIL held (which serialises it). Never destroyed: at
// interpreter exit the Python objects it may still hold must not be released
// after Python is gone, so they are leaked instead.
std::vector<Parked>& lot() {
  static auto* parked = new std::vector<Parked>();
  return *parked;
}

bool is_done(const std::function<bool()>& done) {
  try {
    return done();
  } catch (...) {
    return true;  // the operation failed: it is over
  }
}

}  // namespace

void park_until_done(std::function<bool()> done, KeepAlive keep) {
  release_finished();
  if (keep.empty() || is_done(done)) return;
  lot().push_back(Parked{std::move(done), std::move(keep)});
}

size_t release_finished() {
  auto& parked = lot();
  std::vector<Parked> finished;
  for (size_t i = 0; i < parked.size();) {
    if (is_done(parked[i].done)) {
      finished.push_back(std::move(parked[i]));
      parked[i] = std::move(parked.back());
      parked.pop_back();
    } else {
      ++i;
    }
  }
  finished.clear();  // drops the references (GIL held) after the list is consistent
  return parked.size();
}

void bind_parking(py::module_& m) {
  m.def("_parked_operations", &release_finished,
        "Releases the arrays of finished operations whose wait timed out or whose handle was "
        "dropped early; returns how many such operations are still running (for tests).");
}

}  // namespace pushpull::python
