// SPDX-License-Identifier: Apache-2.0
// The rank `pushpull bench startup` launches (tools/bench_startup.cpp,
// docs/scaling.md "Start-up"): a C++ program that only creates a store,
// pushpulls one 4-float key and checks the value, as a user's first step
// does. It writes "<create_s> <pushpull_s>" to <dir>/result.<rank> and exits
// 0, or prints the reason and exits 1 (wrong value, an error of the store).
//
//   pp_startup_probe <kvstore type> <dir> [--worker-mesh]
//
// --worker-mesh: ClusterOptions::worker_mesh (every PS worker also dials every
// lower-rank worker, the start-up before issue 38), so one run shows the old
// and the new PS start-up side by side.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "pushpull/array.h"
#include "pushpull/error.h"
#include "pushpull/kvstore.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: pp_startup_probe <kvstore type> <dir> [--worker-mesh]\n");
    return 2;
  }
  const std::string type = argv[1], dir = argv[2];
  const bool mesh = argc > 3 && std::strcmp(argv[3], "--worker-mesh") == 0;
  using Clock = std::chrono::steady_clock;
  try {
    auto options = pushpull::Options::from_env();
    options.cluster.worker_mesh = mesh;
    const auto t0 = Clock::now();
    auto kv = pushpull::create_kvstore(type, options);
    const auto t1 = Clock::now();
    const pushpull::Shape shape{4};
    pushpull::Array w = pushpull::Array::full(shape, 0.0);
    kv->init(0, w);
    pushpull::Array grad = pushpull::Array::full(shape, 1.0 + kv->rank());
    pushpull::Array out(shape, pushpull::DType::kFloat32);
    kv->pushpull(0, grad, out);
    const auto t2 = Clock::now();
    // Without an updater the sum of every worker's push replaces the value
    // (dist_sync) or is the allreduce's result: 1 + 2 + ... + n.
    const int n = kv->num_workers();
    const float want = static_cast<float>(n) * static_cast<float>(n + 1) / 2.0f;
    for (int64_t i = 0; i < 4; ++i)
      if (out.as<float>()[i] != want) {
        std::fprintf(stderr, "pp_startup_probe rank %d: element %ld is %g, expected %g\n",
                     kv->rank(), static_cast<long>(i), out.as<float>()[i], want);
        return 1;
      }
    const std::string path = fmt::format("{}/result.{}", dir, kv->rank());
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "pp_startup_probe: cannot write %s\n", path.c_str());
      return 1;
    }
    std::fprintf(f, "%.6f %.6f\n", std::chrono::duration<double>(t1 - t0).count(),
                 std::chrono::duration<double>(t2 - t1).count());
    std::fclose(f);
  } catch (const pushpull::Error& e) {
    std::fprintf(stderr, "pp_startup_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
