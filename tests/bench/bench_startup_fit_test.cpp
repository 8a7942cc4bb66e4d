// SPDX-License-Identifier: Apache-2.0
// `pushpull bench startup`'s exponent fit and engine names (tools/bench_startup.h).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "bench_startup.h"
#include "pushpull/error.h"

namespace pushpull::cli {
namespace {

TEST(BenchStartupFit, RecoversAPowerLaw) {
  std::vector<double> x = {8, 16, 32, 64, 128, 256}, y;
  for (double n : x)
    y.push_back(0.01 * std::pow(n, 1.5));
  LogLogFit f = fit_loglog(x, y);
  EXPECT_NEAR(f.exponent, 1.5, 1e-9);
  EXPECT_NEAR(f.r2, 1.0, 1e-9);
  EXPECT_EQ(f.points, 6);
}

TEST(BenchStartupFit, SkipsFailedRunsAndNeedsTwoPoints) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  LogLogFit f = fit_loglog({8, 16, 32}, {1.0, 2.0, nan});  // the failed 32 is left out
  EXPECT_NEAR(f.exponent, 1.0, 1e-9);
  EXPECT_EQ(f.points, 2);
  LogLogFit one = fit_loglog({8, 16}, {1.0, nan});
  EXPECT_TRUE(std::isnan(one.exponent));
  EXPECT_EQ(one.points, 1);
  EXPECT_TRUE(std::isnan(fit_loglog({8, 8}, {1.0, 2.0}).exponent));  // no spread in x
}

TEST(BenchStartupFit, Engines) {
  EXPECT_EQ(startup_engine("ps", 2).kvstore, "dist_sync");
  EXPECT_EQ(startup_engine("ps", 2).servers, 2);
  EXPECT_TRUE(startup_engine("ps_mesh", 2).worker_mesh);
  EXPECT_EQ(startup_engine("collective", 2).servers, 0);
  EXPECT_THROW(startup_engine("gloo", 2), InvalidArgument);
}

}  // namespace
}  // namespace pushpull::cli
