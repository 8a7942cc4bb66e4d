// SPDX-License-Identifier: Apache-2.0
// An injectable monotonic clock for the liveness logic (heartbeats, failure
// detectors, stall inspection), so their unit tests drive time by hand instead
// of sleeping and asserting on elapsed wall time.
//
// Production code uses steady_clock_source() (std::chrono::steady_clock);
// tests use ManualClock and advance() it.
//
// Thread safety: now() may be called from any thread; ManualClock's setters
// too (the time is an atomic). Ownership: the objects that take a clock
// borrow it; it must outlive them (steady_clock_source() lives forever).
#pragma once

#include <atomic>
#include <chrono>

namespace pushpull {

class ClockSource {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;
  virtual ~ClockSource() = default;
  virtual time_point now() const = 0;
};

// std::chrono::steady_clock.
class SteadyClockSource final : public ClockSource {
 public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
};

// The process-wide steady clock.
inline const ClockSource& steady_clock_source() {
  static const SteadyClockSource clock;
  return clock;
}

// A clock that only moves when told to (tests). Starts at an arbitrary
// non-zero point so "never seen" (time_point{}) differs from "seen at start".
class ManualClock final : public ClockSource {
 public:
  ManualClock() : ticks_(std::chrono::hours(1).count() * 1'000'000'000LL) {}
  time_point now() const override { return time_point(duration(ticks_.load())); }
  void advance(duration d) { ticks_ += d.count(); }

 private:
  static_assert(std::is_same_v<duration::period, std::nano>);
  std::atomic<int64_t> ticks_;
};

}  // namespace pushpull
