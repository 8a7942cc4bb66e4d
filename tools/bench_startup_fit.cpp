// SPDX-License-Identifier: Apache-2.0
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "bench_startup.h"
#include "pushpull/error.h"

namespace pushpull::cli {

LogLogFit fit_loglog(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> lx, ly;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    if (x[i] > 0 && std::isfinite(y[i]) && y[i] > 0) {
      lx.push_back(std::log(x[i]));
      ly.push_back(std::log(y[i]));
    }
  LogLogFit fit;
  fit.points = static_cast<int>(lx.size());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (lx.size() < 2) return {nan, nan, fit.points};
  double mx = 0, my = 0;
  for (size_t i = 0; i < lx.size(); ++i)
    mx += lx[i], my += ly[i];
  mx /= static_cast<double>(lx.size());
  my /= static_cast<double>(ly.size());
  double sxx = 0, sxy = 0, syy = 0;
  for (size_t i = 0; i < lx.size(); ++i) {
    sxx += (lx[i] - mx) * (lx[i] - mx);
    sxy += (lx[i] - mx) * (ly[i] - my);
    syy += (ly[i] - my) * (ly[i] - my);
  }
  if (sxx <= 0) return {nan, nan, fit.points};
  fit.exponent = sxy / sxx;
  // The residual sum of squares over the total; syy == 0: a flat line, exact.
  const double a = my - fit.exponent * mx;
  double rss = 0;
  for (size_t i = 0; i < lx.size(); ++i) {
    const double e = ly[i] - (a + fit.exponent * lx[i]);
    rss += e * e;
  }
  fit.r2 = syy > 0 ? 1.0 - rss / syy : 1.0;
  return fit;
}

StartupEngine startup_engine(const std::string& name, int ps_servers) {
  if (name == "ps") return {name, "dist_sync", ps_servers, false};
  if (name == "ps_mesh") return {name, "dist_sync", ps_servers, true};
  if (name == "collective") return {name, "dist_sync_allreduce", 0, false};
  throw InvalidArgument(
      fmt::format("bench startup: unknown engine '{}' (ps, ps_mesh, collective)", name));
}

}  // namespace pushpull::cli
