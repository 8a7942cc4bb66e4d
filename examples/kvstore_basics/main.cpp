// SPDX-License-Identifier: Apache-2.0
// The MXNet KVStore tutorial in C++: init a key, pull it to two "devices",
// push from both (the store sums them), then install an updater.
//
//   build/bin/kvstore_basics [--kvstore local]
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "pushpull/array.h"
#include "pushpull/error.h"
#include "pushpull/kvstore.h"

namespace {

using pushpull::Array;
using pushpull::ArrayView;

void print(const std::string& title, const ArrayView& a) {
  fmt::print("{} {}:\n", title, a.shape.to_string());
  const int64_t cols = a.shape.ndim() > 1 ? a.shape[a.shape.ndim() - 1] : a.numel();
  for (int64_t i = 0; i < a.numel(); ++i) {
    fmt::print("{}{:8.4f}", i % cols == 0 ? "  [" : " ", pushpull::get_element(a, i));
    if (i % cols == cols - 1) fmt::print(" ]\n");
  }
}

// True when every element of `a` is `want`.
bool all_equal(const ArrayView& a, double want) {
  for (int64_t i = 0; i < a.numel(); ++i)
    if (pushpull::get_element(a, i) != want) return false;
  return true;
}

int run(const std::string& type) {
  auto kv = pushpull::create_kvstore(type, pushpull::Options::from_env());
  const pushpull::Shape shape{2, 3};
  const int devices = 2;
  fmt::print("kvstore type {}: rank {} of {} worker(s), {} devices per worker\n\n", kv->type(),
             kv->rank(), kv->num_workers(), devices);

  // 1. init: the store keeps a copy of the first value (rank 0's in a job).
  Array weight(shape, pushpull::DType::kFloat32);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (int64_t i = 0; i < weight.numel(); ++i)
    weight.as<float>()[i] = uniform(rng);
  kv->init("weight", weight);
  print("init: weight", weight);

  // 2. pull to two devices (two CPU arrays here).
  std::vector<Array> dev;
  pushpull::ArrayList views;
  for (int d = 0; d < devices; ++d) {
    dev.emplace_back(shape, pushpull::DType::kFloat32);
    views.push_back(dev.back());
  }
  kv->pull("weight", views);
  for (int d = 0; d < devices; ++d)
    print(fmt::format("pull to device {}", d), dev[d]);

  // 3. push ones + d from device d: the store sums over devices and workers.
  std::vector<Array> grads;
  pushpull::ArrayList grad_views;
  for (int d = 0; d < devices; ++d) {
    grads.push_back(Array::full(shape, 1.0 + d));
    grad_views.push_back(grads.back());
  }
  const double per_worker = devices * (devices + 1) / 2.0;  // 1 + 2
  const double expected = per_worker * kv->num_workers();
  kv->push("weight", grad_views);
  kv->pull("weight", views);
  print(fmt::format("push ones+d from {} devices x {} worker(s), pull (expect all {})", devices,
                    kv->num_workers(), expected),
        dev[0]);
  bool ok = all_equal(dev[0], expected) && all_equal(dev[1], expected);

  // 4. an updater: stored += summed * 2. Parameter servers cannot run a C++
  // function, so there the same rule is the `test` optimizer
  // (weight += rescale_grad * grad), which runs on the servers.
  const bool on_servers = kv->type().rfind("dist_", 0) == 0 && kv->type() != "dist_sync_allreduce";
  if (on_servers) {
    kv->set_optimizer(pushpull::OptimizerSpec::parse("test:rescale_grad=2"));
  } else {
    kv->set_updater([](const pushpull::Key&, const ArrayView& summed, const ArrayView& stored) {
      for (int64_t i = 0; i < stored.numel(); ++i)
        stored.as<float>()[i] += summed.as<const float>()[i] * 2;
    });
  }
  kv->push("weight", grad_views);
  kv->pull("weight", views);
  const double updated = expected + 2 * expected;
  print(fmt::format("with {} stored += summed * 2, push again, pull (expect all {})",
                    on_servers ? "the servers' optimizer" : "updater", updated),
        dev[0]);
  ok = ok && all_equal(dev[0], updated) && all_equal(dev[1], updated);
  kv->barrier();
  fmt::print("\n{}\n", ok ? "all values as expected" : "UNEXPECTED VALUES");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The MXNet KVStore tutorial on a pushpull store"};
  std::string type = "local";
  app.add_option("--kvstore", type, "store type (local, device, ...)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(type);
  } catch (const pushpull::Error& e) {
    fmt::print(stderr, "kvstore_basics: {}\n", e.what());
    return 2;
  }
}
