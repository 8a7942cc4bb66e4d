// SPDX-License-Identifier: Apache-2.0
// The benchmarks' statistics: medians over the runs that succeeded, and the
// round-by-round ratios `bench step` reports next to the ratio of medians.
#include "bench_common.h"

#include <gtest/gtest.h>

#include <cmath>

namespace pushpull::cli {
namespace {

const double kFailed = std::nan("");

TEST(BenchStats, TheMedianSkipsFailedRuns) {
  EXPECT_DOUBLE_EQ(median({3, kFailed, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 2, 3}), 2.5);
  EXPECT_DOUBLE_EQ(median({kFailed}), 0);
  EXPECT_DOUBLE_EQ(median({}), 0);
}

// Round 2 ran while the machine was twice as slow for both: its ratio is the
// same as the others', while the ratio of medians is not.
TEST(BenchStats, PairedRatiosCompareRoundByRoundAndSkipFailedRounds) {
  const std::vector<double> base = {100, 200, 110, 120};
  const std::vector<double> impl = {80, 160, kFailed, 90};
  const PairedRatio r = paired_ratio(impl, base);
  EXPECT_EQ(r.rounds, 3u);
  EXPECT_DOUBLE_EQ(r.median, 0.8);
  EXPECT_DOUBLE_EQ(r.min, 0.75);
  EXPECT_DOUBLE_EQ(r.max, 0.8);
  EXPECT_EQ(format_paired(r), "0.800 (0.750-0.800)");
  EXPECT_EQ(paired_ratio({1}, {kFailed}).rounds, 0u);
  EXPECT_EQ(format_paired(paired_ratio({1}, {kFailed})), "");
  EXPECT_EQ(format_paired(paired_ratio({1}, {2})), "0.500");
}

}  // namespace
}  // namespace pushpull::cli
