// SPDX-License-Identifier: Apache-2.0
// The timeline's public face (include/pushpull/timeline.h) over the
// process-wide recorder (base/timeline.h).
#include "base/timeline.h"
#include "pushpull/timeline.h"

// The public face (include/pushpull/timeline.h).
namespace pushpull {

bool timeline_enabled() {
  return timeline::enabled();
}

void timeline_span(std::string_view node, std::string_view lane, std::string_view name,
                   std::chrono::steady_clock::time_point begin,
                   std::chrono::steady_clock::time_point end) {
  timeline::span(node, lane, name, begin, end);
}

const std::string& timeline_process_node() {
  return timeline::process_node();
}

}  // namespace pushpull
