// SPDX-License-Identifier: Apache-2.0
// A parameter-server job on one host (scheduler, 2 servers with replication,
// 2 workers, dist_sync, in this process over real connections) moves every
// tensor byte through shared memory and none over loopback TCP; with
// PUSHPULL_PS_SHM=0 the same job moves them over TCP. The values are the
// same either way. Replicas are lent (transport/shm/lend.h: the backup copies them out
// of the primary's memory, not through the ring), and a backup that does not
// read lent memory (PUSHPULL_PS_LEND=0) gets them by value.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "base/metrics.h"
#include "kvstore/inprocess_job.h"
#include "pushpull/array.h"
#include "pushpull/optimizer.h"

namespace pushpull {
namespace {

int64_t shm_bytes() {
  return metrics::value(metrics::Counter::kNetShmBytes);
}
int64_t tcp_bytes() {
  return metrics::value(metrics::Counter::kNetTcpBytes);
}

// Runs the job; returns {shm bytes, tcp bytes} it sent.
std::pair<int64_t, int64_t> run_job(bool shm) {
  InProcessJob job{2, 2, "dist_sync", Options{}};
  job.options.log_level = LogLevel::kWarning;
  job.options.cluster.ps_replicas = 1;
  job.options.net.ps_shared_memory = shm;
  job.options.kvstore.bigarray_bound = 1000;  // the big key is split over both servers
  const int64_t shm0 = shm_bytes(), tcp0 = tcp_bytes();
  run_inprocess_job(job, [](KVStore& kv) {
    Array small = Array::full(Shape{10}, 1.0), big = Array::full(Shape{300000}, 1.0);
    Array out_small(Shape{10}, DType::kFloat32), out_big(Shape{300000}, DType::kFloat32);
    kv.init(0, small.view());
    kv.init(1, big.view());
    for (int round = 0; round < 3; ++round) {
      kv.pushpull(0, small.view(), out_small.view());
      kv.pushpull(1, big.view(), out_big.view());
    }
    // No optimizer: the value after a round is the sum of the 2 workers' pushes.
    EXPECT_EQ(out_small.view().as<float>()[9], 2.0f);
    EXPECT_EQ(out_big.view().as<float>()[299999], 2.0f);
  });
  return {shm_bytes() - shm0, tcp_bytes() - tcp0};
}

TEST(ShmPsJob, OneHostMovesNoTensorBytesOverTcp) {
  auto [shm, tcp] = run_job(true);
  // Pushes, pull replies and replicas: at least the big key's 1.2 MB per
  // worker per round each way.
  EXPECT_GT(shm, 2 * 3 * 2 * 1200000);
  EXPECT_EQ(tcp, 0);
  std::printf("shared memory on: %lld bytes through shm, %lld over tcp\n",
              static_cast<long long>(shm), static_cast<long long>(tcp));
}

TEST(ShmPsJob, OptOutMovesThemOverTcp) {
  auto [shm, tcp] = run_job(false);
  EXPECT_EQ(shm, 0);
  EXPECT_GT(tcp, 2 * 3 * 2 * 1200000);
  std::printf("PUSHPULL_PS_SHM=0: %lld bytes through shm, %lld over tcp\n",
              static_cast<long long>(shm), static_cast<long long>(tcp));
}

int64_t lent_bytes() {
  return metrics::value(metrics::Counter::kNetLentBytes);
}

struct LendRun {
  int64_t shm = 0, lent = 0;
};

// 2 servers (replicas 1), 2 workers, a 16 MB key split over both servers in
// chunks of more than 256 KiB (the lending pool's smallest), 3 rounds of the
// `test` optimizer (value += the summed pushes); `lend_off` turns
// PUSHPULL_PS_LEND off on those servers (by start order).
LendRun run_lending_job(std::vector<int> lend_off) {
  InProcessJob job{2, 2, "dist_sync", Options{}};
  job.options.log_level = LogLevel::kWarning;
  job.options.cluster.ps_replicas = 1;
  job.options.kvstore.bigarray_bound = 1000;
  job.node_options = [&](Role role, int i, Options& o) {
    if (role == Role::kServer && std::find(lend_off.begin(), lend_off.end(), i) != lend_off.end())
      o.net.ps_lend = false;
  };
  const int64_t n = 4 << 20;
  const int64_t shm0 = shm_bytes(), lent0 = lent_bytes();
  run_inprocess_job(job, [&](KVStore& kv) {
    Array zero = Array::full(Shape{n}, 0.0), grad = Array::full(Shape{n}, 1.0);
    Array out(Shape{n}, DType::kFloat32);
    kv.init(0, zero.view());
    kv.set_optimizer(OptimizerSpec::parse("test:rescale_grad=1"));
    for (int round = 0; round < 3; ++round)
      kv.pushpull(0, grad.view(), out.view());
    // Each round adds both workers' pushes: 2, 4, 6, on both servers' slices.
    const float* v = out.view().as<float>();
    EXPECT_EQ(v[0], 6.0f);
    EXPECT_EQ(v[n / 2], 6.0f);
    EXPECT_EQ(v[n - 1], 6.0f);
  });
  return {shm_bytes() - shm0, lent_bytes() - lent0};
}

TEST(ShmPsJob, ReplicasAreLentToSameHostBackups) {
  LendRun lent = run_lending_job({});
  LendRun by_value = run_lending_job({0, 1});
  std::printf("replicas lent: %lld bytes lent, %lld through shm; by value: %lld through shm\n",
              static_cast<long long>(lent.lent), static_cast<long long>(lent.shm),
              static_cast<long long>(by_value.shm));
  // Every round's 16 MB (and the init's) reached a backup by lending ...
  EXPECT_GE(lent.lent, 3 * 16 * 1000 * 1000);
  EXPECT_EQ(by_value.lent, 0);
  // ... instead of through the rings.
  EXPECT_LE(lent.shm + 3 * 16 * 1000 * 1000, by_value.shm);
}

TEST(ShmPsJob, ABackupThatReadsNoLentMemoryGetsTheBytes) {
  // The first server neither lends nor reads: the other lends to it, is told
  // to send the bytes instead, and does; the values are exact (checked in
  // run_lending_job) and the job ends.
  LendRun mixed = run_lending_job({0});
  EXPECT_EQ(mixed.lent, 0);
  EXPECT_GE(mixed.shm, 2 * 3 * 16 * 1000 * 1000);
}

}  // namespace
}  // namespace pushpull
