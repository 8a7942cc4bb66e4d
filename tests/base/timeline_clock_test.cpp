// SPDX-License-Identifier: Apache-2.0
// The timeline's clock alignment (base/clock_sync.h): on one host the true
// offset is 0, so the measured offset is the method's error; it stays within
// half the round trip. Nothing listening: no answer within the deadline.
#include "base/clock_sync.h"

#include <chrono>
#include <cstdlib>

#include <gtest/gtest.h>

namespace {

namespace b = pushpull::base;

TEST(timeline_clock, OffsetOnOneHostIsWithinHalfTheRoundTrip) {
  b::ClockService service;
  const int port = service.start("127.0.0.1");
  auto o = b::measure_offset("127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->samples, 16);
  EXPECT_GT(o->rtt_ns, 0);
  EXPECT_LE(std::llabs(o->offset_ns), o->rtt_ns / 2 + 1000);
  EXPECT_LT(std::llabs(o->offset_ns), 1000000);  // < 1 ms
  std::printf("offset %lld ns, round trip %lld ns\n", static_cast<long long>(o->offset_ns),
              static_cast<long long>(o->rtt_ns));
}

TEST(timeline_clock, NoServiceNoAnswerWithinTheDeadline) {
  int port;
  {
    b::ClockService gone;
    port = gone.start("127.0.0.1");
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(
      b::measure_offset("127.0.0.1:" + std::to_string(port), 16, std::chrono::milliseconds(300))
          .has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1000));
  EXPECT_FALSE(b::measure_offset("no-port").has_value());
}

}  // namespace
