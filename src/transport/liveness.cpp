// SPDX-License-Identifier: Apache-2.0
#include "transport/liveness.h"

#include <algorithm>

namespace pushpull::transport {

Liveness::Liveness(LivenessTimes times, const ClockSource& clock, const ClockSource& beats)
    : times_(times),
      clock_(&clock),
      beats_(&beats),
      silence_(clock, times.timeout),
      verdict_(clock),
      next_beat_(beats.now()) {}

void Liveness::heard(Member m) {
  silence_.heard(m);
  probing_.erase(m);
}

void Liveness::forget(Member m) {
  silence_.forget(m);
  probing_.erase(m);
}

Liveness::Event Liveness::poll() {
  if (auto due = verdict_.suspect_due()) return Event{.kind = Event::kSuspectDue, .why = *due};
  if (!verdict_.failure()) {
    const auto now = clock_->now();
    for (const auto& [m, until] : probing_)
      if (now >= until) {
        Event e{.kind = Event::kDead, .member = m, .silence = silence_.silence(m), .why = {}};
        forget(m);
        return e;
      }
    auto probed = [&](Member m) { return probing_.count(m) > 0; };
    if (auto expired = silence_.first_expired(probed)) {
      Event e{.member = expired->first, .silence = expired->second, .why = {}};
      if (times_.probe_window > Millis{0}) {
        e.kind = Event::kProbe;
        probing_[e.member] = now + times_.probe_window;
      } else {
        e.kind = Event::kDead;
        forget(e.member);
      }
      return e;
    }
  }
  if (beats_->now() >= next_beat_) {
    next_beat_ = beats_->now() + times_.interval;
    return Event{.kind = Event::kBeat, .member = 0, .silence = {}, .why = {}};
  }
  return Event{};
}

Millis Liveness::until_next() const {
  // Rounded up: waking a little early would only find nothing due.
  auto left =
      std::clamp(std::chrono::ceil<Millis>(next_beat_ - beats_->now()), Millis{0}, times_.interval);
  auto decide_at = verdict_.suspect_deadline();
  if (!verdict_.failure()) {
    for (const auto& [m, until] : probing_)
      decide_at = std::min(decide_at, until);
    decide_at = std::min(decide_at,
                         silence_.next_deadline([&](Member m) { return probing_.count(m) > 0; }));
  }
  if (decide_at != time_point::max())
    left =
        std::min(left, std::max(Millis{0}, std::chrono::ceil<Millis>(decide_at - clock_->now())));
  return left;
}

}  // namespace pushpull::transport
