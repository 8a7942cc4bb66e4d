// SPDX-License-Identifier: Apache-2.0
// Test program for the parameter-server fail-over tests (ps_failover_test):
// a worker that trains K rounds on three keys with MXNet's `test` optimizer
// (weight += rescale_grad * grad) and checks every value in closed form.
//
//   ps_failover_worker MODE ROUNDS SLEEP_MS
//     MODE sync:  each round, pushpull of every key; the value pulled after
//                 round k must be exactly 1 + N(N+1)/2 * rate * k
//     MODE async: K pushes, then a barrier and one pull: exactly the total
//
// Worker r pushes (r + 1) everywhere; rate = 0.5; values start at 1. Keys:
// "small32" (float32, 10 elements), "small16" (float16, 10), "big" (float32,
// 6000 elements: split over the servers with PUSHPULL_BIGARRAY_BOUND=1000,
// and chunked with a small PUSHPULL_PS_CHUNK_BYTES). Prints "ROUND k" after
// each round (worker 0), "OK worker r" at the end and exits 0; a wrong value
// prints "WRONG ..." and exits 4; an error "ERROR <type>: <msg>" and exits 3.
// A job resumed from a checkpoint (PUSHPULL_RESUME_ROUND=R, docs/ps.md
// "Checkpoints") starts at round R + 1: the servers hold round R's values.
// A restarted worker (launch --max-restarts, docs/ps.md "Worker restart")
// starts at restart_round() + 1.
//
// Values start per element at 1 + (e mod 10), so a value read at the wrong
// offset or from the wrong chunk shows. Fault hooks (tests that need a fault
// at an exact place of the program; PP_TEST_REPLACEMENT=1 in a restarted
// process turns them off):
//   PP_TEST_BARRIER_EVERY=E  sync: kv->barrier() every E rounds, after the
//                            round (PP_TEST_BARRIER_AT=end, an epoch end) or
//                            before it (=start)
//   PP_TEST_DIE=R:K:WHERE    worker R kills itself (SIGKILL) at round K:
//                            before_barrier (the others wait in it),
//                            in_barrier (after entering it),
//                            before_set_optimizer (K ignored)
//   PP_TEST_PAUSE_BEFORE_INIT_MS=N  worker 0 prints "BEFORE INIT" and waits
//                            N ms after creating the store, before init
#include <fmt/format.h>

#include <signal.h>
#include <algorithm>

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
  if (argc < 4) {
    fmt::print(stderr, "usage: ps_failover_worker sync|async ROUNDS SLEEP_MS [LARGE_ELEMENTS]\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int rounds = std::stoi(argv[2]);
  const int sleep_ms = std::stoi(argv[3]);
  // A fourth key this large (float32), when given: its slices are chunked in
  // pieces big enough for same-host replicas to be lent (transport/shm/lend.h).
  const int64_t large = argc > 4 ? std::stoll(argv[4]) : 0;
  const double rate = 0.5;
  try {
    auto options = Options::from_env();
    set_log_level(options.log_level);
    auto kv = create_kvstore(mode == "async" ? "dist_async" : "dist_sync", options);
    const int n = kv->num_workers(), r = kv->rank();
    std::vector<std::string> names = {"small32", "small16", "big"};
    std::vector<Array> values, grads;
    values.push_back(Array::full(Shape{10}, 1.0));
    values.push_back(Array::full(Shape{10}, 1.0, DType::kFloat16));
    values.push_back(Array::full(Shape{6000}, 1.0));
    if (large > 0) {
      names.push_back("large");
      values.push_back(Array::full(Shape{large}, 1.0));
    }
    auto initial = [](int64_t e) { return 1.0 + static_cast<double>(e % 10); };
    for (auto& v : values)
      for (int64_t e = 0; e < v.numel(); ++e)
        set_element(v.view(), e, initial(e));
    // Fault hooks (see above).
    const bool replacement = std::getenv("PP_TEST_REPLACEMENT") != nullptr;
    int die_rank = -1, die_round = -1;
    std::string die_where;
    if (const char* d = std::getenv("PP_TEST_DIE"); d && !replacement) {
      std::string spec = d;
      auto a = spec.find(':'), b = spec.find(':', a + 1);
      die_rank = std::stoi(spec.substr(0, a));
      die_round = std::stoi(spec.substr(a + 1, b - a - 1));
      die_where = spec.substr(b + 1);
    }
    const char* every_env = std::getenv("PP_TEST_BARRIER_EVERY");
    const int every = every_env ? std::atoi(every_env) : 0;
    const char* at_env = std::getenv("PP_TEST_BARRIER_AT");
    const bool at_start = at_env && std::string(at_env) == "start";
    for (auto& v : values)
      grads.push_back(Array::full(v.shape(), r + 1.0, v.dtype()));
    std::vector<Key> keys(names.begin(), names.end());
    std::vector<ArrayView> views, gviews;
    for (size_t i = 0; i < values.size(); ++i) {
      views.push_back(values[i].view());
      gviews.push_back(grads[i].view());
    }
    if (const char* p = std::getenv("PP_TEST_PAUSE_BEFORE_INIT_MS"); p && r == 0 && !replacement) {
      fmt::print("BEFORE INIT\n");
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(p)));
    }
    kv->init(keys, views);
    if (die_rank == r && die_where == "before_set_optimizer") {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others wait in it
      ::raise(SIGKILL);
    }
    kv->set_optimizer(OptimizerSpec::parse(fmt::format("test:rescale_grad={}", rate)));
    auto check = [&](int k) {
      for (size_t i = 0; i < values.size(); ++i)
        for (int64_t e = 0; e < values[i].numel(); ++e)
          if (double got = get_element(values[i].view(), e),
              want = initial(e) + n * (n + 1) / 2.0 * rate * k;
              got != want) {
            fmt::print("WRONG worker {} key {} element {} after round {}: {} != {}\n", r, names[i],
                       e, k, got, want);
            std::fflush(stdout);
            return false;
          }
      return true;
    };
    const char* resumed = std::getenv("PUSHPULL_RESUME_ROUND");
    // A restarted worker (--max-restarts) resumes after the rounds its rank
    // completed: the servers' values and counts were adopted by init.
    const int first = std::max<int>(resumed ? std::atoi(resumed) + 1 : 1, kv->restart_round() + 1);
    auto epoch_barrier = [&](int k) {
      if (die_rank == r && die_round == k && die_where == "before_barrier") {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others wait in it
        ::raise(SIGKILL);
      }
      if (die_rank == r && die_round == k && die_where == "in_barrier") {
        std::thread([&] { kv->barrier(); }).detach();
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it arrived
        ::raise(SIGKILL);
      }
      kv->barrier();
    };
    for (int k = first; k <= rounds; ++k) {
      if (mode == "sync" && every > 0 && at_start && (k - 1) % every == 0) epoch_barrier(k);
      if (mode == "async") {
        for (size_t i = 0; i < keys.size(); ++i)
          kv->push(keys[i], gviews[i]);
      } else {
        for (size_t i = 0; i < keys.size(); ++i)
          kv->pushpull(keys[i], gviews[i], views[i]);
        if (!check(k)) return 4;
        if (every > 0 && !at_start && k % every == 0) epoch_barrier(k);
      }
      if (r == 0) {
        fmt::print("ROUND {}\n", k);
        std::fflush(stdout);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    }
    if (mode == "async") {
      kv->wait_all();
      kv->barrier();
      for (size_t i = 0; i < keys.size(); ++i)
        kv->pull(keys[i], views[i]);
      if (!check(rounds)) return 4;
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
