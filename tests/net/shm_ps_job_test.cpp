// SPDX-License-Identifier: Apache-2.0
// A parameter-server job on one host (scheduler, 2 servers with replication,
// 2 workers, dist_sync, in this process over real connections) moves every
// tensor byte through shared memory and none over loopback TCP; with
// PUSHPULL_PS_SHM=0 the same job moves them over TCP. The values are the
// same either way.
#include <gtest/gtest.h>

#include "base/metrics.h"
#include "kvstore/inprocess_job.h"
#include "pushpull/array.h"

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

}  // namespace
}  // namespace pushpull
