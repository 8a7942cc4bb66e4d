// SPDX-License-Identifier: Apache-2.0
// Rank program of the adversary suite's collective job
// (tests/security/adversary.py, run with `pushpull launch -s 0`): allreduces
// a small and a large float32 tensor for --rounds rounds, --sleep-ms apart,
// while the adversary attacks every port of the job, and checks every value.
// Round r: rank k contributes r + 1 + k, so every element of the sum must be
// N * (r + 1) + N * (N - 1) / 2 (exact in float32).
// Prints "READY" after the first round, "PASS rounds=R" and exits 0, or "FAIL <what>" / "ERROR
// <code>: <msg>" and exits 1 / 3.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "pushpull/collective.h"
#include "pushpull/error.h"

namespace cl = pushpull::collective;

int main(int argc, char** argv) {
  using pushpull::Array;
  using pushpull::Shape;
  int rounds = 200, sleep_ms = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--rounds") rounds = std::stoi(argv[i + 1]);
    if (k == "--sleep-ms") sleep_ms = std::stoi(argv[i + 1]);
  }
  try {
    cl::init();
    const int rank = cl::rank(), n = cl::size();
    const std::vector<int64_t> sizes = {1000, 1 << 19};
    for (int r = 0; r < rounds; ++r) {
      const float want = static_cast<float>(n * (r + 1.0) + n * (n - 1) / 2.0);
      for (size_t k = 0; k < sizes.size(); ++k) {
        Array a = Array::full(Shape{sizes[k]}, r + 1.0 + rank);
        cl::allreduce(fmt::format("t{}", k), a.view());
        const float* got = a.as<float>();
        for (int64_t i = 0; i < sizes[k]; ++i)
          if (got[i] != want) {
            fmt::print("FAIL round {} tensor {} element {}: got {} want {}\n", r, k, i, got[i],
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
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    }
    cl::shutdown();
    fmt::print("PASS rounds={}\n", rounds);
  } catch (const pushpull::Error& e) {
    fmt::print("ERROR {}: {}\n", pushpull::error_code_name(e.code()), e.what());
    std::fflush(stdout);
    return 3;
  }
  return 0;
}
