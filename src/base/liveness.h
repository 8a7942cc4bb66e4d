// SPDX-License-Identifier: Apache-2.0
// The testable pieces of failure detection. They hold no threads and do no
// I/O: the one detector built from them (transport/liveness.h, used by the
// cluster's scheduler and nodes and the collectives' mesh) feeds them events
// and the time (from a ClockSource, see base/clock.h) and acts on what they
// answer; the scale simulation (tests/sim) uses SilenceDetector directly.
//
// - SilenceDetector<Key>: when each watched member was last heard from; a
//   member silent for longer than the timeout is expired.
// - Verdict: the first failure of a group, plus a suspect: a peer whose
//   connection closed is blamed only after a grace period, unless a better
//   cause (another node named dead by someone who knows) arrives first.
//
// Thread safety: none; the owner guards them with its own lock.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <utility>

#include "base/clock.h"
#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull {

template <typename Key>
class SilenceDetector {
 public:
  using time_point = ClockSource::time_point;

  SilenceDetector(const ClockSource& clock, Millis timeout) : clock_(&clock), timeout_(timeout) {}

  Millis timeout() const { return timeout_; }
  // Starts watching `k` (its silence starts now), or resets it.
  void heard(const Key& k) { last_[k] = clock_->now(); }
  void forget(const Key& k) { last_.erase(k); }
  bool watching(const Key& k) const { return last_.count(k) > 0; }
  // How long `k` has been silent (0 when not watched).
  Millis silence(const Key& k) const {
    auto it = last_.find(k);
    if (it == last_.end()) return Millis{0};
    return std::chrono::ceil<Millis>(clock_->now() - it->second);
  }
  // The member silent the longest, when that is more than the timeout, and
  // how long it has been silent.
  // Members for which skip(key) is true are left out (the mesh detector's
  // members under probe).
  template <typename Skip = bool (*)(const Key&)>
  std::optional<std::pair<Key, Millis>> first_expired(Skip skip = never) const {
    auto now = clock_->now();
    const std::pair<const Key, time_point>* worst = nullptr;
    for (const auto& kv : last_)
      if (now - kv.second > timeout_ && !skip(kv.first) && (!worst || kv.second < worst->second))
        worst = &kv;
    if (!worst) return std::nullopt;
    return std::make_pair(worst->first, std::chrono::ceil<Millis>(now - worst->second));
  }
  // When the next member would expire if nothing is heard (time_point::max()
  // when nothing is watched).
  template <typename Skip = bool (*)(const Key&)>
  time_point next_deadline(Skip skip = never) const {
    auto next = time_point::max();
    for (const auto& kv : last_)
      if (!skip(kv.first))
        next = std::min(next, kv.second + timeout_ + std::chrono::milliseconds(1));
    return next;
  }

 private:
  static bool never(const Key&) { return false; }
  const ClockSource* clock_;
  Millis timeout_;
  std::map<Key, time_point> last_;
};

class Verdict {
 public:
  using time_point = ClockSource::time_point;

  explicit Verdict(const ClockSource& clock) : clock_(&clock) {}

  // The first failure (nullopt while healthy).
  const std::optional<Status>& failure() const { return failure_; }
  // Records `why` as the failure unless one is already recorded; true when
  // this call set it.
  bool decide(Status why) {
    if (failure_) return false;
    failure_ = std::move(why);
    return true;
  }
  // A peer's connection closed: blame `why` after `grace` unless decide()
  // runs first. Keeps the earliest suspect.
  void suspect(Status why, Millis grace) {
    if (failure_ || suspect_) return;
    suspect_ = std::move(why);
    suspect_deadline_ = clock_->now() + grace;
  }
  bool has_suspect() const { return suspect_.has_value() && !failure_; }
  time_point suspect_deadline() const {
    return has_suspect() ? suspect_deadline_ : time_point::max();
  }
  // The suspect, once its grace is over and nothing better was decided (the
  // owner then decides it).
  std::optional<Status> suspect_due() const {
    if (!has_suspect() || clock_->now() < suspect_deadline_) return std::nullopt;
    return suspect_;
  }

 private:
  const ClockSource* clock_;
  std::optional<Status> failure_;
  std::optional<Status> suspect_;
  time_point suspect_deadline_{};
};

}  // namespace pushpull
