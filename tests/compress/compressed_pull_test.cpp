// SPDX-License-Identifier: Apache-2.0
// Compressed pulls through a whole dist_sync job (scheduler, 2 servers and 3
// workers as threads on loopback; docs/kvstore.md "Compressed pulls"): with
// each codec and no optimizer on the servers, every worker's pull after
// every round equals the closed form of both error feedbacks (each worker's
// residual, then the server's), element by element on every element; and
// the payload bytes the job moves (net counters: TCP and same-host shared
// memory) shrink in both directions as the codec says. With an optimizer
// pulls stay whole (the value is a weight).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/metrics.h"
#include "kvstore/dist_store.h"
#include "kvstore/inprocess_job.h"
#include "pushpull/dtype.h"
#include "pushpull/kvstore.h"

namespace pushpull {
namespace {

// One value through a codec with its residual (the definitions of
// compress/two_bit.h, one_bit.h, fp16.h); returns what travels.
float model_send(const std::string& type, float t, float& r, float g) {
  r += g;
  float q;
  if (type == "2bit")
    q = r >= t ? t : (r <= -t ? -t : 0.0f);
  else if (type == "1bit")
    q = r > t ? 1.0f : -1.0f;
  else
    q = half_to_float(float_to_half(r));
  r -= q;
  return q;
}

float grad_of(int w, int64_t i) {
  return (i % 2 ? -1.0f : 1.0f) * 0.3f * static_cast<float>(w + 1);
}

Options job_options() {
  Options o;
  o.cluster.heartbeat_interval = Millis(200);
  o.cluster.heartbeat_timeout = Millis(5000);
  o.cluster.startup_timeout = Millis(30000);
  o.kvstore.server_threads = 2;
  o.kvstore.wait_timeout = Millis(30000);
  o.kvstore.bigarray_bound = 1000;  // the key is split over both servers, in chunks
  o.kvstore.file_key_env = Environment::current();
  return o;
}

int64_t net_bytes() {
  return metrics::value(metrics::Counter::kNetTcpBytes) +
         metrics::value(metrics::Counter::kNetShmBytes);
}

constexpr int kWorkers = 3;
constexpr int64_t kN = 20001;

struct Expected {
  std::vector<std::vector<float>> want;  // per round, per element class
};

Expected expected(const std::string& type, float t, int rounds) {
  Expected run;
  float wres[kWorkers][2] = {}, sres[2] = {};
  for (int round = 0; round < rounds; ++round) {
    std::vector<float> v(2);
    for (int cls = 0; cls < 2; ++cls) {
      float sum = 0;
      for (int w = 0; w < kWorkers; ++w)
        sum += model_send(type, t, wres[w][cls], grad_of(w, cls));
      v[cls] = model_send(type, t, sres[cls], sum);  // the server's own feedback
    }
    run.want.push_back(v);
  }
  return run;
}

// Runs `rounds` pushpulls of key 1 (kN float32 values) with compression
// `type` (none: uncompressed) and optionally the servers' "test" optimizer;
// checks every worker's result each round with `check`. `replicas`: -1 the
// default (a backup per part with two servers: each round's value also goes
// to a backup, uncompressed), 0 none. Returns the payload bytes the whole
// job moved between workers and servers (counted once every node stopped,
// so no send is still on its way).
int64_t run_job(const std::string& type, bool optimizer, int rounds, int replicas,
                const std::function<void(int round, const Array& out, int rank)>& check,
                std::atomic<uint64_t>* decoded = nullptr) {
  Options o = job_options();
  o.cluster.ps_replicas = replicas;
  const int64_t before = net_bytes();
  run_inprocess_job(InProcessJob{2, kWorkers, "dist_sync", o}, [&](KVStore& kv) {
    if (type != "none") {
      using Params = std::map<std::string, std::string>;
      kv.set_gradient_compression(type == "1bit" ? Params{{"type", type}, {"threshold", "0"}}
                                                 : Params{{"type", type}});
    }
    kv.init(1, Array::full(Shape{kN}, 0.0).view());
    if (optimizer) kv.set_optimizer(OptimizerSpec::parse("test:rescale_grad=1"));
    Array g(Shape{kN}, DType::kFloat32), out(Shape{kN}, DType::kFloat32);
    for (int64_t i = 0; i < kN; ++i)
      set_element(g, i, grad_of(kv.rank(), i));
    for (int round = 0; round < rounds; ++round) {
      kv.pushpull(1, g.view(), out.view());
      check(round, out, kv.rank());
    }
    // Replies this worker decoded in place (each chunk of each round).
    if (decoded) *decoded += dynamic_cast<DistStore&>(kv).pulls_compressed();
  });
  return net_bytes() - before;
}

// Payload bytes of one round: the difference of a job of 3 rounds and one
// of 1, halved (the init and startup cancel out).
int64_t round_bytes(const std::string& type, bool optimizer,
                    const std::function<void(int round, const Array& out, int rank)>& check) {
  const int64_t one = run_job(type, optimizer, 1, 0, check);
  return (run_job(type, optimizer, 3, 0, check) - one) / 2;
}

TEST(CompressedPulls, EveryWorkerPullsBothFeedbacksClosedFormAndTheBytesShrink) {
  const int rounds = 4;
  const int64_t raw = round_bytes("none", false, [](int, const Array&, int) {});
  // Pushes and pulls of kWorkers workers: 2 * 4 bytes a value each (plus a
  // little: the barriers go to the scheduler, not counted).
  ASSERT_GE(raw, 2 * kWorkers * kN * 4);
  ASSERT_LT(raw, 2 * kWorkers * kN * 4 * 11 / 10);
  const std::map<std::string, double> ratio{{"2bit", 1.0 / 16}, {"1bit", 1.0 / 32}, {"fp16", 0.5}};
  for (const auto& [type, r] : ratio) {
    const float t = type == "1bit" ? 0.0f : 0.5f;
    const Expected want = expected(type, t, rounds);
    auto check = [&](int round, const Array& out, int rank) {
      for (int64_t i = 0; i < kN; ++i) {
        const float w = want.want[static_cast<size_t>(round)][static_cast<size_t>(i % 2)];
        const float got = static_cast<float>(get_element(out, i));
        ASSERT_EQ(got, w) << type << " round " << round << " i " << i << " worker " << rank;
      }
    };
    std::atomic<uint64_t> decoded{0};
    run_job(type, false, rounds, -1, check, &decoded);  // replicated: the backups' path too
    // Every chunk's reply of every round (the key is cut into several).
    EXPECT_GE(decoded.load(), static_cast<uint64_t>(kWorkers * rounds * 2)) << type;
    const int64_t bytes = round_bytes(type, false, check);
    // Both directions shrink: within a few percent (headers) of the ratio.
    EXPECT_LT(static_cast<double>(bytes), raw * r * 1.15) << type;
    EXPECT_GT(static_cast<double>(bytes), raw * r * 0.9) << type;
  }
}

// The "test" optimizer (w += grad) makes the value a weight: pulls answer
// it whole, so only the push direction shrinks.
TEST(CompressedPulls, WithAnOptimizerOnlyPushesShrink) {
  const int64_t raw = 2 * kWorkers * kN * 4;
  std::atomic<uint64_t> decoded{0};
  run_job(
      "fp16", true, 2, -1, [](int, const Array&, int) {}, &decoded);
  EXPECT_EQ(decoded.load(), 0u) << "a pull of a weight came compressed";
  const int64_t bytes = round_bytes("2bit", true, [](int round, const Array& out, int) {
    // Round 1: every worker sent ±0.5 (|0.3 w| residuals cross 0.5 from w = 1).
    ASSERT_TRUE(std::isfinite(get_element(out, 0))) << round;
  });
  EXPECT_GT(bytes, raw / 2);
  EXPECT_LT(bytes, raw / 2 + raw / 16 + raw / 50);
}

}  // namespace
}  // namespace pushpull
