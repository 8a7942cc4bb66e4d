// SPDX-License-Identifier: Apache-2.0
// The dist_sync_allreduce KVStore with its workers as threads of this process:
// the value checks of the parameter-server tests (dist_store_test.cpp), over
// the in-process collective transport, plus the real bootstrap (create_kvstore
// with a MASTER_ADDR rendezvous on loopback).
#include "kvstore/allreduce_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvstore/store_checks.h"

#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "collective/inprocess_transport.h"
#include "support/ports.h"

namespace pushpull {
namespace {

using ::testing::HasSubstr;

Options store_options() {
  Options o;
  o.kvstore.wait_timeout = Millis(30000);
  o.kvstore.engine_threads = 2;
  return o;
}

collective::CommunicatorOptions comm_options() {
  collective::CommunicatorOptions c;
  c.peer_timeout = Millis(5000);
  c.wait_timeout = Millis(30000);
  c.collective.cycle_time_ms = 0.5;
  return c;
}

// Runs body(store) for n workers on n threads; rethrows the first exception.
// A worker that throws destroys its store, which fails the others' pending
// collectives with PeerFailure instead of leaving them waiting.
void run_workers(int n, const std::function<void(KVStore&)>& body) {
  collective::InProcessFabric fabric(n);
  std::exception_ptr first;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = std::make_unique<collective::Communicator>(fabric.endpoint(r), comm_options());
        AllreduceStore store("dist_sync_allreduce", store_options(), std::move(comm));
        body(store);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : threads)
    t.join();
  if (first) std::rethrow_exception(first);
}

class AllreduceRounds : public ::testing::TestWithParam<testing::RoundCase> {};

TEST_P(AllreduceRounds, TestOptimizerGivesClosedForm) {
  const int n = 3;
  run_workers(n, [&](KVStore& kv) { testing::check_closed_form_rounds(kv, GetParam(), n); });
}

INSTANTIATE_TEST_SUITE_P(SmallAndBig, AllreduceRounds, testing::round_cases(),
                         testing::round_case_name);

TEST(AllreduceStore, PushOfTwoDevicesPerWorkerSumsEverything) {
  run_workers(2, [](KVStore& kv) {
    EXPECT_EQ(kv.num_workers(), 2);
    kv.init("weight", Array::full(Shape{2, 3}, 0.5).view());
    Array d0 = Array::full(Shape{2, 3}, 1.0), d1 = Array::full(Shape{2, 3}, 2.0);
    Array o0(Shape{2, 3}, DType::kFloat32), o1(Shape{2, 3}, DType::kFloat32);
    kv.push("weight", ArrayList{d0.view(), d1.view()});
    kv.pull("weight", ArrayList{o0.view(), o1.view()});
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(o0.as<float>()[i], 6.0f);  // (1 + 2) per worker, two workers
      EXPECT_EQ(o1.as<float>()[i], 6.0f);
    }
    // pushpull: the same in one call
    Array p(Shape{2, 3}, DType::kFloat32);
    kv.pushpull("weight", ArrayList{d1.view()}, ArrayList{p.view()});
    EXPECT_EQ(p.as<float>()[5], 4.0f);
  });
}

TEST(AllreduceStore, InitValuesFromWorkerZeroForManyKeys) {
  run_workers(3, [](KVStore& kv) {
    std::vector<Key> keys;
    std::vector<Array> values;
    for (int i = 0; i < 100; ++i) {
      keys.emplace_back(i);
      int64_t n = i % 2 ? 2000 : 5;
      // Other workers' values are ignored: worker 0's reach everyone.
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
  });
}

TEST(AllreduceStore, RowSparsePull) {
  run_workers(2, [](KVStore& kv) {
    const int64_t rows = 50, cols = 40;
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
          ASSERT_EQ(out.as<float>()[r * cols + c], asked ? static_cast<float>(r * cols + c) : 0.0f)
              << "row " << r << " case " << which;
      }
    }
    std::vector<int64_t> bad{rows};
    Array out(Shape{rows, cols}, DType::kFloat32);
    EXPECT_THROW(kv.row_sparse_pull(3, out.view(), ArrayView(bad.data(), Shape{1})),
                 InvalidArgument);
  });
}

TEST(AllreduceStore, LocalUpdaterSeesTheReducedSum) {
  run_workers(3, [](KVStore& kv) {
    kv.init(1, Array::full(Shape{4}, 1.0).view());
    kv.set_updater([](const Key&, const ArrayView& summed, const ArrayView& stored) {
      for (int64_t i = 0; i < stored.numel(); ++i)
        stored.as<float>()[i] += summed.as<const float>()[i] * 2;
    });
    Array g = Array::full(Shape{4}, kv.rank() + 1.0);
    Array out(Shape{4}, DType::kFloat32);
    kv.push(1, g.view());
    kv.pull(1, out.view());
    EXPECT_EQ(out.as<float>()[3], 1.0f + 2 * 6);
  });
}

// Workers push keys in opposite orders and keep several pushes of one key in
// flight (more than the store's name slots): no deadlock, every push applied.
TEST(AllreduceStore, AsyncPushesInDifferentOrdersAllApply) {
  run_workers(2, [](KVStore& kv) {
    const int keys = 8, pushes = 7;
    std::vector<Key> ks;
    std::vector<Array> init;
    for (int k = 0; k < keys; ++k) {
      ks.emplace_back(k);
      init.push_back(Array::full(Shape{300}, 0.0));
    }
    kv.init(ks, std::vector<ArrayView>(init.begin(), init.end()));
    kv.set_optimizer(OptimizerSpec::parse("test:rescale_grad=1"));
    Array g = Array::full(Shape{300}, 1.0);
    std::vector<KVHandle> hs;
    for (int p = 0; p < pushes; ++p)
      for (int i = 0; i < keys; ++i) {
        int k = kv.rank() == 0 ? i : keys - 1 - i;
        hs.push_back(kv.push_async({Key(k)}, {ArrayList{g.view()}}, 0));
      }
    for (auto& h : hs)
      kv.wait(h);
    for (int k = 0; k < keys; ++k) {
      Array out(Shape{300}, DType::kFloat32);
      kv.pull(k, out.view());
      EXPECT_EQ(out.as<float>()[299], 2.0f * pushes) << "key " << k;
    }
    kv.barrier();
  });
}

TEST(AllreduceStore, OptimizerStatesSurviveARestartOfTheJob) {
  std::string path =
      ::testing::TempDir() + "/pushpull-allreduce-states-" + std::to_string(getpid());
  auto spec = OptimizerSpec::parse("sgd:learning_rate=0.1,momentum=0.9");
  Array after_two(Shape{2000}, DType::kFloat32), after_three(Shape{2000}, DType::kFloat32);
  run_workers(2, [&](KVStore& kv) {
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
  });
  // A new job starts from the weights after two steps; only the loaded
  // momentum (on every worker: each runs the optimizer) makes its third step
  // equal the first job's.
  run_workers(2, [&](KVStore& kv) {
    kv.init(4, after_two.view());
    kv.set_optimizer(spec);
    kv.load_optimizer_states(path);
    Array g = Array::full(Shape{2000}, 1.0);
    Array w(Shape{2000}, DType::kFloat32);
    kv.push(4, g.view());
    kv.pull(4, w.view());
    EXPECT_EQ(w.as<float>()[0], after_three.as<float>()[0]);
    EXPECT_EQ(w.as<float>()[1999], after_three.as<float>()[1999]);
    EXPECT_NE(w.as<float>()[0], after_two.as<float>()[0] - 0.1f * 2);  // not momentum-free
  });
  std::filesystem::remove(path);
}

TEST(AllreduceStore, BadInputIsRejectedOnTheWorkerThatMadeIt) {
  run_workers(2, [](KVStore& kv) {
    kv.init(1, Array::full(Shape{2, 3}, 1.0).view());
    Array wrong_shape = Array::full(Shape{3, 2}, 1.0);
    Array wrong_dtype = Array::full(Shape{2, 3}, 1.0, DType::kFloat64);
    Array ok(Shape{2, 3}, DType::kFloat32);
    EXPECT_THROW(kv.push(2, ok.view()), NotFound);
    try {
      kv.push(1, wrong_shape.view());
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("(3, 2)"));
      EXPECT_THAT(e.what(), HasSubstr("(2, 3)"));
    }
    EXPECT_THROW(kv.push(1, wrong_dtype.view()), InvalidArgument);
    EXPECT_THROW(kv.push(1, ArrayList{}), InvalidArgument);
    EXPECT_THROW(kv.pull(std::vector<Key>{1, "x"}, std::vector<ArrayView>{ok.view(), ok.view()}),
                 InvalidArgument);
    EXPECT_THROW(kv.pull(1, ArrayView(nullptr, DType::kFloat32, Shape{2, 3})), InvalidArgument);
    EXPECT_THROW(kv.init(1, ok.view()), AlreadyExists);
    EXPECT_THROW(kv.init("s", ok.view()), InvalidArgument);  // int keys here
    EXPECT_THROW(kv.set_optimizer(OptimizerSpec::parse("sgdd")), InvalidArgument);
    EXPECT_THROW(kv.set_gradient_compression({{"type", "2bit"}}), InvalidArgument);
    EXPECT_THROW(kv.save_optimizer_states("/tmp/x"), InvalidArgument);  // no optimizer
    kv.set_gradient_compression({{"type", "none"}});
    // The store still works for everyone.
    kv.push(1, ok.view());
    kv.pull(1, ok.view());
    EXPECT_EQ(ok.as<float>()[0], 0.0f);  // sum of two zero pushes
  });
}

TEST(AllreduceStore, ADeadWorkerFailsThePushesOfTheOthers) {
  collective::InProcessFabric fabric(2);
  auto c0 = std::make_unique<collective::Communicator>(fabric.endpoint(0), comm_options());
  auto c1 = std::make_unique<collective::Communicator>(fabric.endpoint(1), comm_options());
  AllreduceStore s0("dist_sync_allreduce", store_options(), std::move(c0));
  std::thread t([&] {
    AllreduceStore s1("dist_sync_allreduce", store_options(), std::move(c1));
    s1.init(1, Array::full(Shape{10}, 1.0).view());
  });  // worker 1 is gone after init
  s0.init(1, Array::full(Shape{10}, 1.0).view());
  t.join();
  Array g = Array::full(Shape{10}, 1.0);
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(s0.push(1, g.view()), PeerFailure);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(6));
}

// create_kvstore with the real bootstrap: a MASTER_ADDR rendezvous on loopback.
TEST(AllreduceStore, CreateKvstoreBootstrapsFromTheOptions) {
  const int n = 2, port = test::free_port();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        Options o = store_options();
        o.collective.rank = r;
        o.collective.size = n;
        o.collective.master_addr = "127.0.0.1";
        o.collective.master_port = port;
        o.cluster.startup_timeout = Millis(20000);
        // free_port() is racy on a shared machine: a job id of our own makes
        // a collision with another program a quick refusal, not a wait.
        o.net.job_id = "allreduce-store-test-" + std::to_string(port);
        auto kv = create_kvstore(r == 0 ? "dist_sync_allreduce" : "allreduce", o);
        EXPECT_EQ(kv->rank(), r);
        kv->init("w", Array::full(Shape{3}, r == 0 ? 5.0 : 0.0).view());
        Array out(Shape{3}, DType::kFloat32);
        kv->pull("w", out.view());
        EXPECT_EQ(out.as<float>()[2], 5.0f);
        kv->push("w", Array::full(Shape{3}, 1.0 + r).view());
        kv->pull("w", out.view());
        EXPECT_EQ(out.as<float>()[0], 3.0f);
        kv->barrier();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads)
    t.join();
  for (auto& e : errors)
    EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace pushpull
