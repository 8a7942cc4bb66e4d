// SPDX-License-Identifier: Apache-2.0
// The cluster layer's Scheduler behind the launcher's EmbeddedScheduler
// interface: bound on the launcher's main thread (so the port handed to the
// children is already listening), run() on a thread of its own.
//
// Thread safety: as EmbeddedScheduler (one controlling thread).
#pragma once

#include "launch/embedded_scheduler.h"

namespace pushpull::launch {

// A factory for `LaunchContext::scheduler_factory`.
SchedulerFactory cluster_scheduler_factory();

}  // namespace pushpull::launch
