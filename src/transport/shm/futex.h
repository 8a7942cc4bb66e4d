// SPDX-License-Identifier: Apache-2.0
// Futex wait/wake on a 32-bit word of a shared (MAP_SHARED) mapping, for
// the shared-memory transport's doorbells. Thread safety: as the system call.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace pushpull::transport {

inline void futex_wake(std::atomic<uint32_t>* w) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

// Sleeps while *w == seen, at most `timeout` (or until a wake or a signal).
inline void futex_wait(std::atomic<uint32_t>* w, uint32_t seen, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
              static_cast<long>(timeout.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

}  // namespace pushpull::transport
