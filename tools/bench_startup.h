// SPDX-License-Identifier: Apache-2.0
// `pushpull bench startup` (bench_startup.cpp, docs/scaling.md "Start-up"):
// the pieces with no processes in them, shared with its unit test.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

namespace pushpull::cli {

// Least squares on log(y) = a + exponent * log(x) over the points with
// x > 0 and a finite y > 0. points = how many were used; with fewer than two
// (or every x equal) the exponent is NaN. r2: the fit's coefficient of
// determination (1 when every point lies on the line).
struct LogLogFit {
  double exponent = 0;
  double r2 = 0;
  int points = 0;
};
LogLogFit fit_loglog(const std::vector<double>& x, const std::vector<double>& y);

// An engine of the benchmark: the kvstore type the probe creates, the
// servers of its job (-s) and whether PS workers also build the worker mesh
// (the start-up before issue 38). Names: ps (dist_sync, `servers` servers),
// ps_mesh (the same with the worker mesh), collective (dist_sync_allreduce,
// -s 0: the collectives' own rendezvous). InvalidArgument for another name.
struct StartupEngine {
  std::string name;
  std::string kvstore;
  int servers = 0;
  bool worker_mesh = false;
};
StartupEngine startup_engine(const std::string& name, int ps_servers);

}  // namespace pushpull::cli
