// SPDX-License-Identifier: Apache-2.0
// The store factory and the local store's deadlines. What every store type
// does (MXNet semantics, bad input, states) is in conformance_test.cpp.
#include "pushpull/kvstore.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "pushpull/error.h"

namespace pushpull {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(KVStoreFactoryTest, UnknownTypeListsValidOnes) {
  EXPECT_THAT(kvstore_types(), ::testing::Contains("local"));
  EXPECT_THAT(kvstore_types(), ::testing::Contains("device"));
  try {
    create_kvstore("dist_snyc");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("dist_snyc"));
    EXPECT_THAT(e.what(), HasSubstr("local_allreduce_device"));
  }
}

TEST(KVStoreFactoryTest, TwoStoresAreIndependent) {
  auto a = create_kvstore("local"), b = create_kvstore("local");
  a->init(1, Array::full({1}, 1));
  b->init(1, Array::full({1}, 2));
  Array o({1}, DType::kFloat32);
  a->pull(1, o.view());
  EXPECT_EQ(get_element(o, 0), 1);
  b->pull(1, o.view());
  EXPECT_EQ(get_element(o, 0), 2);
}

TEST(KVStoreTimeoutTest, BlockingCallsHaveADeadline) {
  Options opts;
  opts.kvstore.wait_timeout = Millis(50);
  auto kv = create_kvstore("local", opts);
  kv->init(1, Array::full({1}, 0));
  std::atomic<bool> release{false};
  kv->set_updater([&](const Key&, const ArrayView&, const ArrayView&) {
    for (int i = 0; i < 2000 && !release; ++i)
      std::this_thread::sleep_for(1ms);
  });
  Array g = Array::full({1}, 1);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(kv->push(1, g.view()), Timeout);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
  release = true;
  KVHandle h = kv->pull_async({1}, {ArrayList{g}});
  h.wait(Millis(10000));
  EXPECT_TRUE(h.done());
}

}  // namespace
}  // namespace pushpull
