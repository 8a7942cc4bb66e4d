// SPDX-License-Identifier: Apache-2.0
// A program's own spans on pushpull's timeline (docs/timeline.md, "Your own
// phases"): with PUSHPULL_TIMELINE (or HOROVOD_TIMELINE) set, every process
// writes a Chrome trace of the engine's work; spans recorded here go into the
// same file, so a training loop can show its forward, backward and update
// next to the communication of each tensor.
//
//   auto t0 = std::chrono::steady_clock::now();
//   loss.backward();
//   pushpull::timeline_span(node, "step", "BACKWARD", t0, std::chrono::steady_clock::now());
//
// The collective engine's lanes belong to node "rank N" (N: the rank in the
// job); the parameter server's to "worker N" / "server N".
//
// Thread safety: every function may be called from any thread. When the
// timeline is off, timeline_span() returns at once.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace pushpull {

// True when this process records a timeline.
bool timeline_enabled();
// Records a span from `begin` to `end` on lane `lane` of node `node` (both
// appear as they are named here); nothing when the timeline is off.
void timeline_span(std::string_view node, std::string_view lane, std::string_view name,
                   std::chrono::steady_clock::time_point begin,
                   std::chrono::steady_clock::time_point end);
// This process's node name from the launcher's variables ("worker 0",
// "rank 1"; "process" when the environment does not say).
const std::string& timeline_process_node();

}  // namespace pushpull
