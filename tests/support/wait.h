// SPDX-License-Identifier: Apache-2.0
// Small test helpers: bounded waiting on a condition.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace pushpull::test {

// Polls `pred` every 2 ms until it holds or `timeout` passes; returns its last value.
inline bool wait_until(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace pushpull::test
