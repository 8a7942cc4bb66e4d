// SPDX-License-Identifier: Apache-2.0
// The one failure-detection mechanism of both engines (issue 36): the
// heartbeat cadence, the silence of the watched members, the optional
// indirect probe of a silent one, and the suspect-with-grace verdict
// (base/liveness.h's SilenceDetector and Verdict), as a driven object. It
// does no I/O and names nobody: its owner sends beats, probes and verdicts
// over its own links and words the errors. Who watches whom is the owner's:
// the cluster Scheduler every node (no probe), a cluster Node the
// scheduler, a collective TcpTransport its ring successor (probed directly
// and through helpers before it is declared). Beats follow `beats` (real
// time, so a test's manual decision clock does not starve the peers of
// heartbeats); silence, probe windows and suspects follow `clock`.
//
// Thread safety: none; the owner guards it with its own mutex (run() takes
// that lock). Ownership: borrows both clocks (they must outlive it).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>

#include "base/clock.h"
#include "base/liveness.h"
#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull::transport {

struct LivenessTimes {
  Millis interval{2000};   // one beat per interval
  Millis timeout{10000};   // a watched member silent for longer is probed, or dead
  Millis probe_window{0};  // how long a probed member has to answer; 0: no probe
};

class Liveness {
 public:
  using Member = uint64_t;  // a rank, a connection id: the owner's key
  using time_point = ClockSource::time_point;
  struct Event {
    enum Kind { kNone, kSuspectDue, kDead, kProbe, kBeat };
    Kind kind = kNone;
    Member member = 0;  // kDead, kProbe
    Millis silence{0};  // kDead, kProbe: how long the member has been silent
    Status why;         // kSuspectDue: the suspect to decide
  };

  explicit Liveness(LivenessTimes times = {}, const ClockSource& clock = steady_clock_source(),
                    const ClockSource& beats = steady_clock_source());

  const LivenessTimes& times() const { return times_; }
  // A sign of life: watches `m` from now (or again), and ends its probe.
  void heard(Member m);
  void forget(Member m);  // it left, or closed (then a suspect, not silent)
  bool watching(Member m) const { return silence_.watching(m); }
  Millis silence(Member m) const { return silence_.silence(m); }
  // The failure and its suspect; once failed, silence decides nothing.
  Verdict& verdict() { return verdict_; }
  const Verdict& verdict() const { return verdict_; }

  // The next due event, consumed (kNone: nothing due), in this order: the
  // suspect past its grace (due again until the owner decides it); while
  // healthy, a probed member that did not answer in time (kDead) and the
  // member silent longest past the timeout (kProbe, or kDead without
  // probes; a dead member is forgotten); then the beat.
  Event poll();
  // How long until poll() may return an event (0..one interval).
  Millis until_next() const;

  // The owner's thread: until stop() (under `lock`), waits on `cv` for the
  // next event and hands it to act() with the lock held (act may release
  // it while it sends; it holds it again when it returns).
  template <typename Stop, typename Act>
  void run(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Stop stop, Act act) {
    while (!stop()) {
      Event e = poll();
      if (e.kind == Event::kNone) {
        cv.wait_for(lock, until_next());
        continue;
      }
      act(std::move(e));
    }
  }

 private:
  LivenessTimes times_;
  const ClockSource* clock_;
  const ClockSource* beats_;
  SilenceDetector<Member> silence_;
  std::map<Member, time_point> probing_;  // member -> end of its probe window
  Verdict verdict_;
  time_point next_beat_;  // on beats_
};

}  // namespace pushpull::transport
