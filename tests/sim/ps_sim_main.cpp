// SPDX-License-Identifier: Apache-2.0
// ps_sim: runs seeds of the deterministic parameter-server simulation
// (tests/sim/ps_world.h) and reports violations.
//
//   ps_sim --seeds N [--first S]   seeds S .. S+N-1 (`make simulate`: 10^4)
//   ps_sim --seed S [--verbose]    one seed: its schedule and outcome
//
// Exit status: 0 without violations, 1 with one (its seed and schedule are
// printed), 2 on bad usage.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "sim/ps_world.h"

using namespace pushpull::sim;

int main(int argc, char** argv) {
  uint64_t first = 1, count = 10'000;
  bool one = false, verbose = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) {
        fmt::print(stderr, "ps_sim: {} needs a value\n", a);
        std::exit(2);
      }
      return std::strtoull(argv[++i], nullptr, 10);
    };
    if (a == "--seeds") {
      count = value();
    } else if (a == "--first") {
      first = value();
    } else if (a == "--seed") {
      first = value();
      count = 1;
      one = true;
    } else if (a == "--verbose") {
      verbose = true;
    } else {
      fmt::print(stderr, "usage: ps_sim [--seeds N] [--first S] | --seed S [--verbose]\n");
      return 2;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  uint64_t finished = 0, failed_cleanly = 0, faults = 0, events = 0;
  int status = 0;
  for (uint64_t seed = first; seed < first + count; ++seed) {
    const Scenario s = scenario_for_seed(seed);
    const Outcome o = run(s);
    faults += s.faults.size();
    events += o.events;
    finished += o.finished;
    failed_cleanly += o.failed_cleanly;
    if (one || verbose)
      fmt::print("{}\n  -> {} after {} events, {} us simulated{}\n", s.describe(),
                 o.finished         ? "finished"
                 : o.failed_cleanly ? "failed: " + o.failure
                                    : "unfinished",
                 o.events, o.end_us, o.violations.empty() ? "" : "; VIOLATIONS:");
    if (!o.violations.empty()) {
      if (!one && !verbose) fmt::print("{}\n", s.describe());
      for (const auto& v : o.violations)
        fmt::print("  VIOLATION: {}\n", v);
      status = 1;
      if (!one) break;
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(
      "ps_sim: {} seeds from {}: {} finished, {} failed cleanly (no replica left), {} with "
      "violations; {} faults, {} events; {:.1f} s ({:.0f} seeds/s)\n",
      count, first, finished, failed_cleanly, status, faults, events, secs, count / secs);
  return status;
}
