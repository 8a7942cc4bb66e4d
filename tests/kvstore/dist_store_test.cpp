// The parameter-server KVStore types end to end, with the scheduler, servers
// and workers of a job as threads of this process on loopback.
#include "kvstore/dist_store.h"
#include "kvstore/inprocess_job.h"

#include <gtest/gtest.h>

#include "kvstore/store_checks.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "pushpull/kernels.h"

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

class DistSyncRounds : public ::testing::TestWithParam<testing::RoundCase> {};

TEST_P(DistSyncRounds, TestOptimizerGivesClosedForm) {
  const int n = 3;
  run_job(2, n, "dist_sync",
          [&](KVStore& kv) { testing::check_closed_form_rounds(kv, GetParam(), n); });
}

INSTANTIATE_TEST_SUITE_P(SmallAndBig, DistSyncRounds, testing::round_cases(),
                         testing::round_case_name);

TEST(DistStore, PushOfTwoDevicesPerWorkerSumsEverything) {
  run_job(2, 2, "dist_device_sync", [](KVStore& kv) {
    kv.init("weight", Array::full(Shape{2, 3}, 0.5).view());
    Array d0 = Array::full(Shape{2, 3}, 1.0), d1 = Array::full(Shape{2, 3}, 2.0);
    Array o0(Shape{2, 3}, DType::kFloat32), o1(Shape{2, 3}, DType::kFloat32);
    kv.push("weight", ArrayList{d0.view(), d1.view()});
    kv.pull("weight", ArrayList{o0.view(), o1.view()});
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(o0.as<float>()[i], 6.0f);  // (1 + 2) per worker, two workers
      EXPECT_EQ(o1.as<float>()[i], 6.0f);
    }
  });
}

TEST(DistStore, InitValuesFromWorkerZeroForManyKeys) {
  // bound 1000: keys of 2000 elements are split over both servers.
  run_job(
      2, 3, "dist_sync",
      [](KVStore& kv) {
        std::vector<Key> keys;
        std::vector<Array> values;
        for (int i = 0; i < 100; ++i) {
          keys.emplace_back(i);
          int64_t n = i % 2 ? 2000 : 5;
          // Other workers' values are ignored: only worker 0's reach the servers.
          values.push_back(Array::full(Shape{n}, kv.rank() == 0 ? i : -1.0));
        }
        std::vector<ArrayView> views(values.begin(), values.end());
        kv.init(keys, views);
        for (int i = 0; i < 100; ++i) {
          Array out(values[i].shape(), DType::kFloat32);
          kv.pull(i, out.view());
          ASSERT_EQ(out.as<float>()[0], i);
          ASSERT_EQ(out.as<float>()[out.numel() - 1], i);
        }
      },
      1000);
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

TEST(DistStore, RowSparsePull) {
  run_job(
      2, 2, "dist_sync",
      [](KVStore& kv) {
        const int64_t rows = 50, cols = 40;  // 2000 elements: split over both servers
        Array v(Shape{rows, cols}, DType::kFloat32);
        for (int64_t i = 0; i < v.numel(); ++i)
          v.as<float>()[i] = static_cast<float>(i);
        kv.init(3, v.view());
        std::mt19937 rng(static_cast<unsigned>(kv.rank()));
        std::vector<int64_t> ids;
        for (int i = 0; i < 30; ++i)
          ids.push_back(static_cast<int64_t>(rng() % rows));
        ids.push_back(ids.front());     // a duplicate
        for (auto which : {0, 1, 2}) {  // random ids, all rows, no rows
          std::vector<int64_t> ask = which == 0 ? ids : std::vector<int64_t>{};
          if (which == 1)
            for (int64_t r = 0; r < rows; ++r)
              ask.push_back(r);
          Array out = Array::full(Shape{rows, cols}, -7.0);
          kv.row_sparse_pull(3, out.view(),
                             ArrayView(ask.data(), Shape{static_cast<int64_t>(ask.size())}));
          for (int64_t r = 0; r < rows; ++r) {
            bool asked = std::find(ask.begin(), ask.end(), r) != ask.end();
            for (int64_t c = 0; c < cols; c += 13)
              ASSERT_EQ(out.as<float>()[r * cols + c],
                        asked ? static_cast<float>(r * cols + c) : 0.0f)
                  << "row " << r << " case " << which;
          }
        }
      },
      1000);
}

TEST(DistStore, TwoBitCompressionWithResidual) {
  run_job(1, 2, "dist_sync", [](KVStore& kv) {
    kv.set_gradient_compression({{"type", "2bit"}, {"threshold", "0.5"}});
    kv.init(9, Array::full(Shape{20}, 0.0).view());
    Array small = Array::full(Shape{20}, 0.3);
    Array out(Shape{20}, DType::kFloat32);
    kv.push(9, small.view());  // residual 0.3 < 0.5: nothing sent
    kv.pull(9, out.view());
    EXPECT_EQ(out.as<float>()[0], 0.0f);
    kv.push(9, small.view());  // residual 0.6: +0.5 sent by each worker
    kv.pull(9, out.view());
    EXPECT_EQ(out.as<float>()[0], 1.0f);
    EXPECT_EQ(out.as<float>()[19], 1.0f);
  });
}

TEST(DistStore, OptimizerStatesSurviveARestartOfTheJob) {
  std::string path = ::testing::TempDir() + "/pushpull-dist-states-" + std::to_string(getpid());
  auto spec = OptimizerSpec::parse("sgd:learning_rate=0.1,momentum=0.9");
  Array after_two(Shape{2000}, DType::kFloat32), after_three(Shape{2000}, DType::kFloat32);
  run_job(
      2, 2, "dist_sync",
      [&](KVStore& kv) {
        kv.init(4, Array::full(Shape{2000}, 1.0).view());
        kv.set_optimizer(spec);
        Array g = Array::full(Shape{2000}, 1.0);
        kv.push(4, g.view());
        kv.push(4, g.view());
        kv.barrier();
        if (kv.rank() == 0) {
          kv.pull(4, after_two.view());
          kv.save_optimizer_states(path);
        }
        kv.barrier();
        kv.push(4, g.view());
        if (kv.rank() == 0) kv.pull(4, after_three.view());
      },
      1000);
  // A new job starts from the weights after two steps; only the loaded
  // momentum makes its third step equal the first job's.
  run_job(
      2, 2, "dist_sync",
      [&](KVStore& kv) {
        kv.init(4, after_two.view());
        kv.set_optimizer(spec);
        if (kv.rank() == 0) kv.load_optimizer_states(path);
        kv.barrier();
        Array g = Array::full(Shape{2000}, 1.0);
        Array w(Shape{2000}, DType::kFloat32);
        kv.push(4, g.view());
        kv.pull(4, w.view());
        EXPECT_EQ(w.as<float>()[0], after_three.as<float>()[0]);
        EXPECT_EQ(w.as<float>()[1999], after_three.as<float>()[1999]);
        EXPECT_NE(w.as<float>()[0],
                  after_two.as<float>()[0] - 0.1f * 2);  // not a momentum-free step
      },
      1000);
  std::filesystem::remove(path);
}

TEST(DistStore, CorruptOptimizerStateFilesAreRefusedBeforeAnythingIsSent) {
  std::string base = ::testing::TempDir() + "/pushpull-bad-states-" + std::to_string(getpid());
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
  run_job(1, 1, "dist_sync", [&](KVStore& kv) {
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
  for (const auto& path : {huge, trailing, cut})
    std::filesystem::remove(path);
}

TEST(DistStore, BadInputIsRejectedOnTheWorkerThatMadeIt) {
  run_job(1, 2, "dist_sync", [](KVStore& kv) {
    kv.init(1, Array::full(Shape{2, 3}, 1.0).view());
    Array wrong_shape = Array::full(Shape{3, 2}, 1.0);
    Array wrong_dtype = Array::full(Shape{2, 3}, 1.0, DType::kFloat64);
    Array ok(Shape{2, 3}, DType::kFloat32);
    EXPECT_THROW(kv.push(2, ok.view()), NotFound);
    try {
      kv.push(1, wrong_shape.view());
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("(3, 2)"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("(2, 3)"), std::string::npos) << e.what();
    }
    EXPECT_THROW(kv.push(1, wrong_dtype.view()), InvalidArgument);
    EXPECT_THROW(kv.push(1, ArrayList{}), InvalidArgument);
    EXPECT_THROW(kv.pull(std::vector<Key>{1, "x"}, std::vector<ArrayView>{ok.view(), ok.view()}),
                 InvalidArgument);
    EXPECT_THROW(kv.pull(1, ArrayView(nullptr, DType::kFloat32, Shape{2, 3})), InvalidArgument);
    EXPECT_THROW(kv.init(1, ok.view()), AlreadyExists);
    EXPECT_THROW(kv.set_updater([](const Key&, const ArrayView&, const ArrayView&) {}),
                 InvalidArgument);
    EXPECT_THROW(kv.set_optimizer(OptimizerSpec::parse("sgdd")), InvalidArgument);
    EXPECT_THROW(kv.set_gradient_compression({{"type", "3bit"}}), InvalidArgument);
    // The store still works for everyone.
    kv.push(1, ok.view());
    kv.pull(1, ok.view());
    EXPECT_EQ(ok.as<float>()[0], 0.0f);  // sum of two zero pushes
  });
}

}  // namespace
}  // namespace pushpull
