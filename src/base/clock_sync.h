// SPDX-License-Identifier: Apache-2.0
// Clock offsets between hosts for the merged timeline (docs/timeline.md,
// "One file for the job"). Timeline timestamps are CLOCK_MONOTONIC, which
// differs arbitrarily between hosts; the launcher serves its own clock
// (ClockService, UDP) and each process measures its offset against it once,
// when its timeline starts, NTP-style: several request/reply exchanges, and
// the one with the smallest round trip gives
//   offset = server_time - (sent + received) / 2,
// wrong by at most half that round trip (the reply's error bound is rtt/2).
//
// The service answers any datagram of the right size and magic with its
// clock: it reveals only its monotonic time and its reply is no larger than
// the request (no amplification), so it needs no job secret.
//
// Ownership: a ClockService owns its socket and thread (stop() or the
// destructor ends it within one 100 ms tick). Thread safety: measure_offset
// keeps no state; ClockService's start/stop from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

namespace pushpull::base {

// CLOCK_MONOTONIC in nanoseconds (the timeline's clock).
int64_t monotonic_ns();

class ClockService {
 public:
  ClockService() = default;
  ClockService(const ClockService&) = delete;
  ClockService& operator=(const ClockService&) = delete;
  ~ClockService() { stop(); }
  // Binds UDP host:0 (an IPv4 address; "" or 0.0.0.0: every interface) and
  // starts answering. Returns the port. Throws IoError.
  int start(const std::string& host);
  void stop();

 private:
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct ClockOffset {
  int64_t offset_ns = 0;  // add to a local CLOCK_MONOTONIC time to get the service's
  int64_t rtt_ns = 0;     // the round trip of the sample used: |error| <= rtt_ns / 2
  int samples = 0;        // exchanges answered
};

// Measures this host's offset to the service at `host_port` ("addr:port"):
// `exchanges` exchanges, each waiting at most 100 ms, all within `deadline`.
// nullopt when none was answered.
std::optional<ClockOffset> measure_offset(
    const std::string& host_port, int exchanges = 16,
    std::chrono::milliseconds deadline = std::chrono::milliseconds(1000));

}  // namespace pushpull::base
