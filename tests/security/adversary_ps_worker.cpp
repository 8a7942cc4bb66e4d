// SPDX-License-Identifier: Apache-2.0
// Worker program of the adversary suite's parameter-server job
// (tests/security/adversary.py): a dist_sync worker that pushes and pulls a
// small and a large key for --rounds rounds, --sleep-ms apart, while the
// adversary attacks every port of the job, and checks every pulled value.
// Round r: worker k pushes r + 1 + k everywhere, so with N workers (no
// updater: the sum replaces the value) every pulled element must be
// N * (r + 1) + N * (N - 1) / 2, exactly representable in float32.
// Prints "READY" after the first round, "PASS rounds=R" and exits 0, or "FAIL <what>" / "ERROR
// <code>: <msg>" and exits 1 / 3.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "pushpull/error.h"
#include "pushpull/kvstore.h"

namespace {

struct Args {
  int rounds = 200;
  int sleep_ms = 50;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    int v = std::stoi(argv[i + 1]);
    if (k == "--rounds") a.rounds = v;
    if (k == "--sleep-ms") a.sleep_ms = v;
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  using pushpull::Array;
  using pushpull::Shape;
  const Args args = parse(argc, argv);
  try {
    auto options = pushpull::Options::from_env();
    pushpull::set_log_level(options.log_level);
    auto kv = pushpull::create_kvstore("dist_sync", options);
    const int rank = kv->rank(), n = kv->num_workers();
    // Key 1 lives on one server; key 2 is large enough to be split over all.
    const std::vector<int64_t> sizes = {1000, 1 << 19};
    std::vector<Array> weights;
    for (size_t k = 0; k < sizes.size(); ++k) {
      weights.push_back(Array::full(Shape{sizes[k]}, 0.0));
      kv->init(static_cast<int>(k + 1), weights[k].view());
    }
    for (int r = 0; r < args.rounds; ++r) {
      const double want = n * (r + 1.0) + n * (n - 1) / 2.0;
      for (size_t k = 0; k < sizes.size(); ++k) {
        Array g = Array::full(Shape{sizes[k]}, r + 1.0 + rank);
        kv->pushpull(static_cast<int>(k + 1), g.view(), weights[k].view());
        const float* got = weights[k].as<float>();
        for (int64_t i = 0; i < sizes[k]; ++i)
          if (got[i] != static_cast<float>(want)) {
            fmt::print("FAIL round {} key {} element {}: got {} want {}\n", r, k + 1, i, got[i],
                       want);
            std::fflush(stdout);
            return 1;
          }
      }
      if (r == 0) {
        // Every connection of this rank is up: the adversary may now claim
        // a connected member's identity.
        fmt::print("READY\n");
        std::fflush(stdout);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(args.sleep_ms));
    }
    fmt::print("PASS rounds={}\n", args.rounds);
  } catch (const pushpull::Error& e) {
    fmt::print("ERROR {}: {}\n", pushpull::error_code_name(e.code()), e.what());
    std::fflush(stdout);
    return 3;
  }
  return 0;
}
