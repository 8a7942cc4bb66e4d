// SPDX-License-Identifier: Apache-2.0
// Test program for backup workers (ps_backup_test, docs/ps.md "Backup
// workers"): a dist_sync worker that trains ROUNDS rounds on three keys with
// MXNet's `test` optimizer (weight += 0.5 * grad), worker r pushing (r + 1)
// everywhere, and prints what it pulled after each round:
//
//   ps_backup_worker ROUNDS STEP_MS
//     VALUE <rank> <round> <increment>   after each round
//     OK worker <rank>                   at the end (exit 0)
//
// The increment is the value minus its initial value; every element of every
// key must have the same one (else "WRONG ..." and exit 4). Which pushes a
// round counted is the server's choice, so the test compares the workers'
// lines with each other and checks each round's step against the sums a
// valid set of pushes gives. PP_TEST_SLOW=R:MS: worker R sleeps MS more per
// step (a straggler). An error prints "ERROR <type>: <msg>" and exits 3.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/kvstore.h"

using namespace pushpull;

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: ps_backup_worker ROUNDS STEP_MS\n");
    return 2;
  }
  const int rounds = std::stoi(argv[1]);
  const int step_ms = std::stoi(argv[2]);
  try {
    auto options = Options::from_env();
    set_log_level(options.log_level);
    auto kv = create_kvstore("dist_sync", options);
    const int r = kv->rank();
    int slow_ms = 0;
    if (const char* s = std::getenv("PP_TEST_SLOW")) {
      std::string spec = s;
      auto colon = spec.find(':');
      if (std::stoi(spec.substr(0, colon)) == r) slow_ms = std::stoi(spec.substr(colon + 1));
    }
    std::vector<std::string> names = {"small32", "small16", "big"};
    std::vector<Array> values, grads;
    values.push_back(Array::full(Shape{10}, 1.0));
    values.push_back(Array::full(Shape{10}, 1.0, DType::kFloat16));
    values.push_back(Array::full(Shape{6000}, 1.0));
    auto initial = [](int64_t e) { return 1.0 + static_cast<double>(e % 10); };
    for (auto& v : values)
      for (int64_t e = 0; e < v.numel(); ++e)
        set_element(v.view(), e, initial(e));
    for (auto& v : values)
      grads.push_back(Array::full(v.shape(), r + 1.0, v.dtype()));
    std::vector<Key> keys(names.begin(), names.end());
    kv->init(keys, {values[0].view(), values[1].view(), values[2].view()});
    kv->set_optimizer(OptimizerSpec::parse("test:rescale_grad=0.5"));
    for (int k = 1; k <= rounds; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms + slow_ms));
      for (size_t i = 0; i < keys.size(); ++i)
        kv->pushpull(keys[i], grads[i].view(), values[i].view());
      const double inc = get_element(values[0].view(), 0) - initial(0);
      for (size_t i = 0; i < values.size(); ++i)
        for (int64_t e = 0; e < values[i].numel(); ++e)
          if (double got = get_element(values[i].view(), e); got != initial(e) + inc) {
            fmt::print("WRONG worker {} key {} element {} after round {}: {} != {}\n", r, names[i],
                       e, k, got, initial(e) + inc);
            std::fflush(stdout);
            return 4;
          }
      fmt::print("VALUE {} {} {:.9g}\n", r, k, inc);
      std::fflush(stdout);
    }
    fmt::print("OK worker {}\n", r);
    std::fflush(stdout);
  } catch (const Error& e) {
    fmt::print("ERROR {}: {}\n", error_code_name(e.code()), e.what());
    std::fflush(stdout);
    return 3;
  }
  return 0;
}
