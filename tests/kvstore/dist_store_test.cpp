// SPDX-License-Identifier: Apache-2.0
// What only the parameter-server KVStore types do, end to end, with the
// scheduler, servers and workers of a job as threads of this process on
// loopback. What every store type does is in conformance_test.cpp.
#include "kvstore/dist_store.h"
#include "base/metrics.h"
#include "kvstore/inprocess_job.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace pushpull {
namespace {

// One job on loopback: `servers` servers and `workers` workers (threads),
// with short heartbeats, each worker running `body(store)`.
void run_job(int servers, int workers, const std::string& type,
             const std::function<void(KVStore&)>& body, int64_t bigarray_bound = 1000000) {
  InProcessJob job{servers, workers, type, Options{}};
  job.options.cluster.heartbeat_interval = Millis(200);
  job.options.cluster.heartbeat_timeout = Millis(5000);
  job.options.cluster.startup_timeout = Millis(30000);
  job.options.kvstore.bigarray_bound = bigarray_bound;
  job.options.kvstore.server_threads = 2;
  job.options.kvstore.wait_timeout = Millis(30000);
  run_inprocess_job(job, body);
}

// On one host (every node registered the same address) a slice travels in
// chunks of chunk_bytes; with a node on another address (127.0.0.2, still
// loopback) in at least 128 per slice of 64 KiB and up. 1 Mi floats over 2
// servers: slices of 2 MiB, so 1 chunk each against 32 (the 64 KiB floor);
// the values arrive whole either way.
size_t chunks_of_a_4_mib_key(const char* other_host) {
  InProcessJob job{2, 1, "dist_sync", Options{}};
  job.options.cluster.startup_timeout = Millis(30000);
  job.options.kvstore.bigarray_bound = 65536;
  job.options.kvstore.wait_timeout = Millis(30000);
  job.node_options = [&](Role role, int i, Options& o) {
    if (other_host && role == Role::kServer && i == 1) o.net.node_host = other_host;
  };
  size_t chunks = 0;
  run_inprocess_job(job, [&](KVStore& kv) {
    constexpr int64_t n = 1 << 20;
    kv.init(3, Array::full(Shape{n}, 1.0).view());
    chunks = dynamic_cast<DistStore&>(kv).chunks_of(3).size();
    std::vector<float> g(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      g[static_cast<size_t>(i)] = static_cast<float>(i % 1000);
    kv.push(3, ArrayView(g.data(), DType::kFloat32, Shape{n}));
    Array out(Shape{n}, DType::kFloat32);
    kv.pull(3, out.view());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += out.as<float>()[i] != static_cast<float>(i % 1000);
    EXPECT_EQ(wrong, 0);
  });
  return chunks;
}

TEST(DistStore, OnOneHostASliceTravelsInChunksOfChunkBytes) {
  EXPECT_EQ(chunks_of_a_4_mib_key(nullptr), 2u);
  EXPECT_EQ(chunks_of_a_4_mib_key("127.0.0.2"), 64u);
}

TEST(DistStore, APushpullIsOneRequestPerChunkAndGetsItsRoundsValue) {
  // 1 Mi floats over 2 servers on one host: 2 chunks. Each chunk's push asks
  // for the chunk's value back (kFlagPullBack): no separate pull.
  constexpr int64_t n = 1 << 20;
  run_job(
      2, 2, "dist_sync",
      [&](KVStore& kv) {
        auto& ds = dynamic_cast<DistStore&>(kv);
        kv.init(3, Array::full(Shape{n}, 1.0).view());
        ASSERT_EQ(ds.chunks_of(3).size(), 2u);
        for (int round = 1; round <= 3; ++round) {
          Array g = Array::full(Shape{n}, static_cast<double>(kv.rank() + round));
          Array out(Shape{n}, DType::kFloat32);
          const uint64_t before = ds.requests_sent();
          kv.pushpull(3, g.view(), out.view());
          EXPECT_EQ(ds.requests_sent() - before, 2u);
          // No optimizer: the round's sum, (0 + r) + (1 + r), replaces the value.
          const float want = static_cast<float>(2 * round + 1);
          EXPECT_EQ(out.as<float>()[0], want) << "round " << round;
          EXPECT_EQ(out.as<float>()[n - 1], want) << "round " << round;
        }
      },
      65536);
}

TEST(DistStore, AsyncAppliesEveryPush) {
  const int n = 3, pushes = 20;
  run_job(
      2, n, "dist_async",
      [&](KVStore& kv) {
        kv.init(1, Array::full(Shape{1500}, 1.0).view());
        Array g = Array::full(Shape{1500}, 1.0);
        EXPECT_THROW(kv.push(1, g.view()), InvalidArgument);  // no optimizer yet
        kv.barrier();
        kv.set_optimizer(OptimizerSpec::parse("test:rescale_grad=1"));
        for (int i = 0; i < pushes; ++i)
          kv.push(1, g.view());
        kv.barrier();
        Array out(Shape{1500}, DType::kFloat32);
        kv.pull(1, out.view());
        EXPECT_EQ(out.as<float>()[0], 1.0f + n * pushes);  // no lost update
        EXPECT_EQ(out.as<float>()[1499], 1.0f + n * pushes);
      },
      1000);
}

// Version 1 files (no tag) are read only with PUSHPULL_ALLOW_INSECURE=1
// (kvstore/states_file.h); even then a malformed one is refused.
TEST(DistStore, CorruptOptimizerStateFilesAreRefusedBeforeAnythingIsSent) {
  std::string dir = (std::filesystem::temp_directory_path() / "pp-bad-states-XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string base = dir + "/states";
  auto file = [&](const std::string& name, std::initializer_list<int> bytes) {
    std::string path = base + name;
    std::ofstream f(path, std::ios::binary);
    for (int b : bytes)
      f.put(static_cast<char>(b));
    return path;
  };
  // Magic "PPDS", version 1, 1 server, then a blob length far past the file.
  const std::string huge =
      file(".huge", {'P', 'P',  'D',  'S',  1,    0,    0,    0,    1,    0,  0,
                     0,   0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 'x'});
  const std::string trailing = file(
      ".trailing", {'P', 'P', 'D', 'S', 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'x', 'y'});
  const std::string cut = file(".cut", {'P', 'P', 'D', 'S', 1, 0});
  InProcessJob job{1, 1, "dist_sync", Options{}};
  job.options.cluster.startup_timeout = Millis(30000);
  job.options.kvstore.wait_timeout = Millis(30000);
  job.options.kvstore.file_key_env =
      Environment{{"PUSHPULL_ALLOW_INSECURE", "1"}, {"PUSHPULL_SECRET_FILE", base + ".secret"}};
  run_inprocess_job(job, [&](KVStore& kv) {
    kv.init(1, Array::full(Shape{3}, 1.0).view());
    kv.set_optimizer(OptimizerSpec::parse("sgd:learning_rate=0.1,momentum=0.9"));
    for (const auto& path : {huge, trailing, cut}) {
      try {
        kv.load_optimizer_states(path);
        ADD_FAILURE() << path << " was accepted";
      } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("not a distributed optimizer-state"),
                  std::string::npos)
            << e.what();
      }
    }
  });
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pushpull
