// SPDX-License-Identifier: Apache-2.0
// PushSchedule (include/pushpull/frontend/push_schedule.h): when a Trainer's
// hook pushes which unit, with replicas, a packed unit, a second gradient
// and a failed push.
#include "pushpull/frontend/push_schedule.h"

#include <gtest/gtest.h>

#include <vector>

#include "pushpull/error.h"

namespace pushpull::frontend {
namespace {

using Ready = PushSchedule::Ready;

TEST(PushSchedule, PushesAUnitOnceEveryMemberHasEveryReplicasGradient) {
  // Units {0, 2} (packed) and {1}; two replicas; hooks armed after a round.
  PushSchedule s({{0, 2}, {1}}, 3, 2, /*push_from_hooks=*/true);
  EXPECT_EQ(s.grad_ready(0).what, Ready::kWait);  // not armed in the first round
  s.end_round();
  EXPECT_EQ(s.grad_ready(0).what, Ready::kWait);  // replica 0
  EXPECT_EQ(s.grad_ready(0).what, Ready::kWait);  // replica 1: member 0 complete
  EXPECT_EQ(s.grad_ready(1).what, Ready::kWait);
  auto r = s.grad_ready(1);
  EXPECT_EQ(r.what, Ready::kPush);
  EXPECT_EQ(r.unit, 1u);
  EXPECT_EQ(s.grad_ready(1).what, Ready::kSecond);  // a third gradient of two replicas
  EXPECT_EQ(s.grad_ready(2).what, Ready::kWait);
  r = s.grad_ready(2);
  EXPECT_EQ(r.what, Ready::kPush);
  EXPECT_EQ(r.unit, 0u);
  EXPECT_TRUE(s.pushed(0));
  s.push_failed(0);  // step() pushes it instead
  EXPECT_FALSE(s.pushed(0));
  EXPECT_TRUE(s.pushed(1));
  s.disarm();
  EXPECT_EQ(s.grad_ready(0).what, Ready::kWait);  // step() is running
  s.end_round();
  EXPECT_FALSE(s.pushed(1));
  EXPECT_EQ(s.grad_ready(1).what, Ready::kWait);
}

TEST(PushSchedule, WithoutHooksNothingIsPushedAndBadUnitsAreRefused) {
  PushSchedule s({{0}, {1}}, 2, 1, /*push_from_hooks=*/false);
  s.end_round();
  EXPECT_EQ(s.grad_ready(0).what, Ready::kWait);
  EXPECT_EQ(s.grad_ready(0).what, Ready::kWait);                           // accumulation is fine
  EXPECT_THROW(PushSchedule({{0}}, 2, 1, true), InvalidArgument);          // 1 in no unit
  EXPECT_THROW(PushSchedule({{0, 1}, {1}}, 2, 1, true), InvalidArgument);  // 1 twice
  EXPECT_THROW(PushSchedule({{0}}, 1, 0, true), InvalidArgument);          // no replica
}

}  // namespace
}  // namespace pushpull::frontend
