// SPDX-License-Identifier: Apache-2.0
// Call order per key, concurrency across keys.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "pushpull/error.h"
#include "pushpull/kvstore.h"

namespace pushpull {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<KVStore> store(int threads) {
  Options o;
  o.kvstore.engine_threads = threads;
  return create_kvstore("local", o);
}

TEST(OrderingTest, AsyncPushesAndPullsOnOneKeyKeepCallOrder) {
  auto kv = store(4);
  const int n = 500;
  kv->init(0, Array::full({64}, -1, DType::kInt64));
  std::vector<Array> ins, outs;
  for (int i = 0; i < n; ++i) {
    ins.push_back(Array::full({64}, i, DType::kInt64));
    outs.emplace_back(Shape{64}, DType::kInt64);
  }
  std::vector<KVHandle> hs;
  for (int i = 0; i < n; ++i) {
    hs.push_back(kv->push_async({0}, {ArrayList{ins[i]}}));
    hs.push_back(kv->pull_async({0}, {ArrayList{outs[i]}}));
  }
  for (auto& h : hs)
    kv->wait(h);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < 64; ++j)
      ASSERT_EQ(outs[i].as<int64_t>()[j], i) << "pull " << i << " saw another push";
}

TEST(OrderingTest, UpdatesAccumulateInOrder) {
  auto kv = store(3);
  kv->init("acc", Array::full({4}, 0, DType::kFloat64));
  kv->set_updater([](const Key&, const ArrayView& g, const ArrayView& w) {
    for (int64_t i = 0; i < w.numel(); ++i)
      w.as<double>()[i] = w.as<double>()[i] * 2 + g.as<const double>()[i];
  });
  // w_{k+1} = 2 w_k + g_k is order-sensitive: any reordering changes the result.
  const int n = 40;
  std::vector<Array> gs, outs;
  for (int i = 0; i < n; ++i) {
    gs.push_back(Array::full({4}, i % 3, DType::kFloat64));
    outs.emplace_back(Shape{4}, DType::kFloat64);
  }
  for (int i = 0; i < n; ++i)
    kv->pushpull_async({"acc"}, {ArrayList{gs[i]}}, {ArrayList{outs[i]}});
  kv->wait_all();
  double w = 0;
  for (int i = 0; i < n; ++i) {
    w = 2 * w + i % 3;
    ASSERT_EQ(get_element(outs[i], 0), w) << i;
  }
}

TEST(OrderingTest, DifferentKeysRunConcurrently) {
  auto kv = store(4);
  const int nkeys = 16;
  for (int k = 0; k < nkeys; ++k)
    kv->init(k, Array::full({1}, 0));
  // Key 0's update waits until another key's update ran; if the store ran
  // keys one after another it could only see that by timing out.
  std::atomic<int> others{0};
  std::atomic<bool> saw_other{false};
  kv->set_updater([&](const Key& k, const ArrayView&, const ArrayView&) {
    if (k.as_int() != 0) {
      ++others;
      return;
    }
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (others == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(100us);
    saw_other = others > 0;
  });
  Array g = Array::full({1}, 1);
  std::vector<Key> keys;
  std::vector<ArrayView> gs;
  for (int k = 0; k < nkeys; ++k) {
    keys.push_back(k);
    gs.push_back(g);
  }
  kv->push(keys, gs);
  EXPECT_TRUE(saw_other);
  EXPECT_EQ(others.load(), nkeys - 1);
}

TEST(OrderingTest, ManyCallerThreads) {
  auto kv = store(4);
  const int threads = 4, per_thread = 200;
  for (int t = 0; t < threads; ++t)
    kv->init(t, Array::full({8}, 0, DType::kInt32));
  kv->set_updater([](const Key&, const ArrayView& g, const ArrayView& w) {
    for (int64_t i = 0; i < w.numel(); ++i)
      w.as<int32_t>()[i] += g.as<const int32_t>()[i];
  });
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      Array one = Array::full({8}, 1, DType::kInt32), out({8}, DType::kInt32);
      for (int i = 0; i < per_thread; ++i) {
        kv->push(t, one.view());
        // Our own pushes are visible in order to our pulls.
        kv->pull(t, out.view());
        EXPECT_EQ(out.as<int32_t>()[0], i + 1);
      }
    });
  for (auto& t : ts)
    t.join();
  // Then every thread pushes to another thread's key at once: sums still add up.
  ts.clear();
  Array one = Array::full({8}, 1, DType::kInt32);
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] { kv->push((t + 1) % threads, one.view()); });
  for (auto& t : ts)
    t.join();
  kv->wait_all();
  for (int t = 0; t < threads; ++t) {
    Array out({8}, DType::kInt32);
    kv->pull(t, out.view());
    EXPECT_EQ(out.as<int32_t>()[7], per_thread + 1);
  }
}

TEST(OrderingTest, HandlesReportCompletion) {
  auto kv = store(2);
  kv->init(1, Array::full({1}, 0));
  std::atomic<bool> go{false};
  kv->set_updater([&](const Key&, const ArrayView&, const ArrayView&) {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!go && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(100us);
  });
  Array g = Array::full({1}, 1);
  KVHandle h = kv->push_async({1}, {ArrayList{g}});
  EXPECT_FALSE(h.done());
  go = true;
  kv->wait(h);
  EXPECT_TRUE(h.done());
  EXPECT_TRUE(KVHandle().done());
}

}  // namespace
}  // namespace pushpull
