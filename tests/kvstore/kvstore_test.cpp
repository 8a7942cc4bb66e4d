// SPDX-License-Identifier: Apache-2.0
// The local/device stores: MXNet semantics and every bad-input case.
#include "pushpull/kvstore.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "pushpull/error.h"

namespace pushpull {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Every element of `a` as double.
std::vector<double> values(const ArrayView& a) {
  std::vector<double> v;
  for (int64_t i = 0; i < a.numel(); ++i)
    v.push_back(get_element(a, i));
  return v;
}
std::vector<double> filled(int64_t n, double x) {
  return std::vector<double>(static_cast<size_t>(n), x);
}

class KVStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<KVStore> kv = create_kvstore(GetParam());
};

TEST_P(KVStoreTest, InitPushPullFollowMXNet) {
  EXPECT_EQ(kv->type(), GetParam());
  EXPECT_EQ(kv->rank(), 0);
  EXPECT_EQ(kv->num_workers(), 1);
  kv->barrier();
  Array w = Array::full({2, 3}, 1.5);
  kv->init(3, w);
  Array a({2, 3}, DType::kFloat32), b({2, 3}, DType::kFloat32);
  kv->pull(3, ArrayList{a, b});
  EXPECT_EQ(values(a), filled(6, 1.5));
  EXPECT_EQ(values(b), filled(6, 1.5));
  // The store kept a copy.
  set_element(w, 0, 100);
  kv->pull(3, a.view());
  EXPECT_EQ(values(a), filled(6, 1.5));

  // Without an updater the sum over devices replaces the value.
  Array g1 = Array::full({2, 3}, 1), g2 = Array::full({2, 3}, 2), g3 = Array::full({2, 3}, 4);
  kv->push(3, ArrayList{g1, g2, g3});
  kv->pull(3, ArrayList{a, b});
  EXPECT_EQ(values(a), filled(6, 7));
  EXPECT_EQ(values(b), filled(6, 7));
  kv->push(3, g2.view());
  kv->pull(3, a.view());
  EXPECT_EQ(values(a), filled(6, 2));
}

TEST_P(KVStoreTest, BatchesOfKeys) {
  std::vector<Array> init, outs;
  std::vector<Key> keys{"a", "b", "c"};
  for (int i = 0; i < 3; ++i) {
    init.push_back(Array::full({4}, i, DType::kFloat64));
    outs.emplace_back(Shape{4}, DType::kFloat64);
  }
  kv->init(keys, {init[0], init[1], init[2]});
  kv->push(keys, std::vector<ArrayList>{{init[2], init[2]}, {init[0]}, {init[1], init[2]}});
  kv->pull(keys, std::vector<ArrayView>{outs[0], outs[1], outs[2]});
  EXPECT_EQ(values(outs[0]), filled(4, 4));
  EXPECT_EQ(values(outs[1]), filled(4, 0));
  EXPECT_EQ(values(outs[2]), filled(4, 3));
}

TEST_P(KVStoreTest, UpdaterGetsSumAndStored) {
  Array w = Array::full({5}, 10, DType::kInt32);
  kv->init(7, w);
  std::vector<Key> seen;
  kv->set_updater([&](const Key& k, const ArrayView& summed, const ArrayView& stored) {
    seen.push_back(k);
    for (int64_t i = 0; i < stored.numel(); ++i)
      set_element(stored, i, get_element(stored, i) + 2 * get_element(summed, i));
  });
  Array g1 = Array::full({5}, 1, DType::kInt32), g2 = Array::full({5}, 2, DType::kInt32);
  Array out({5}, DType::kInt32);
  kv->pushpull(7, ArrayList{g1, g2}, ArrayList{out});
  EXPECT_EQ(values(out), filled(5, 16));
  EXPECT_EQ(seen, std::vector<Key>{7});
  // Clearing the updater goes back to "replace".
  kv->set_updater(nullptr);
  kv->pushpull(7, g1, out);
  EXPECT_EQ(values(out), filled(5, 1));
}

TEST_P(KVStoreTest, UpdaterErrorReachesTheCaller) {
  kv->init(1, Array::full({2}, 0));
  kv->set_updater([](const Key& k, const ArrayView&, const ArrayView&) {
    throw InvalidArgument("updater refused key " + k.to_string());
  });
  Array g = Array::full({2}, 1);
  try {
    kv->push(1, g.view());
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("refused key 1"));
  }
}

TEST_P(KVStoreTest, OptimizerUpdatesLikeSgd) {
  kv->set_optimizer(OptimizerSpec::parse("sgd:learning_rate=0.5,momentum=0.5,rescale_grad=0.5"));
  kv->init("w", Array::full({3}, 1.0));
  Array g1 = Array::full({3}, 1), g2 = Array::full({3}, 3), out({3}, DType::kFloat32);
  double w = 1, mom = 0;
  for (int step = 0; step < 3; ++step) {
    kv->pushpull("w", ArrayList{g1, g2}, ArrayList{out});
    mom = 0.5 * mom - 0.5 * (0.5 * 4);
    w += mom;
    EXPECT_EQ(values(out), filled(3, w)) << step;
  }
}

TEST_P(KVStoreTest, StringKeys) {
  kv->init("fc1.weight", Array::full({2}, 1));
  kv->init(std::vector<Key>{"fc1.bias", "fc2.weight"}, {Array::full({1}, 2), Array::full({1}, 3)});
  Array o1({2}, DType::kFloat32), o2({1}, DType::kFloat32);
  kv->pull(std::vector<Key>{"fc1.weight", "fc2.weight"}, std::vector<ArrayView>{o1, o2});
  EXPECT_EQ(values(o1), filled(2, 1));
  EXPECT_EQ(values(o2), filled(1, 3));
}

TEST_P(KVStoreTest, HalfPrecisionSumsInFloat32) {
  // 2048 + 1 + 1: pairwise float16 sums round 2049 back to 2048 each time;
  // a float32 sum gives 2050, which float16 holds exactly.
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const double big = dt == DType::kFloat16 ? 2048 : 256;
    Key key(dt == DType::kFloat16 ? 16 : 17);
    kv->init(key, Array::full({8}, 0, dt));
    Array a = Array::full({8}, big, dt), b = Array::full({8}, 1, dt), c = Array::full({8}, 1, dt);
    Array out({8}, dt);
    kv->pushpull(key, ArrayList{a, b, c}, ArrayList{out});
    EXPECT_EQ(values(out), filled(8, big + 2)) << dtype_name(dt);
    // With an optimizer the float32 sum goes to the update unrounded.
    if (dt == DType::kFloat16) {
      kv->set_optimizer(OptimizerSpec::parse("test"));
      kv->pushpull(key, ArrayList{a, b, c}, ArrayList{out});
      EXPECT_EQ(values(out), filled(8, 2 * (big + 2)));
      kv->set_updater(nullptr);
    }
  }
}

TEST_P(KVStoreTest, RowSparsePull) {
  Array w({4, 2}, DType::kFloat32);
  for (int i = 0; i < 8; ++i)
    w.as<float>()[i] = static_cast<float>(i);
  kv->init(0, w);
  // MXNet's meaning: `out` has the value's shape; listed rows (duplicates and
  // any order allowed) get the value's rows, every other row is zero.
  int64_t rows[3] = {3, 0, 3};
  Array o1 = Array::full({4, 2}, -1.0), o2 = Array::full({4, 2}, -1.0);
  kv->row_sparse_pull(0, ArrayList{o1, o2}, ArrayView(rows, {3}));
  EXPECT_EQ(values(o1), (std::vector<double>{0, 1, 0, 0, 0, 0, 6, 7}));
  EXPECT_EQ(values(o2), values(o1));
  int32_t rows32[1] = {2};
  kv->row_sparse_pull(0, o1.view(), ArrayView(rows32, {1}));
  EXPECT_EQ(values(o1), (std::vector<double>{0, 0, 0, 0, 4, 5, 0, 0}));
  kv->row_sparse_pull(0, o1.view(), ArrayView(rows32, {0}));  // no rows: all zero
  EXPECT_EQ(values(o1), (std::vector<double>(8, 0.0)));
  int64_t bad_rows[1] = {4};
  EXPECT_THROW(kv->row_sparse_pull(0, o1.view(), ArrayView(bad_rows, {1})), InvalidArgument);
  Array small({1, 2}, DType::kFloat32);
  EXPECT_THROW(kv->row_sparse_pull(0, small.view(), ArrayView(rows32, {1})), InvalidArgument);
  float frows[1] = {1};
  EXPECT_THROW(kv->row_sparse_pull(0, o1.view(), ArrayView(frows, {1})), InvalidArgument);
}

TEST_P(KVStoreTest, GradientCompressionIsRefusedClearly) {
  // Nothing leaves the process: a compression type is an error, not ignored.
  try {
    kv->set_gradient_compression({{"type", "2bit"}, {"threshold", "0.5"}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("nothing leaves this process"));
  }
  EXPECT_THROW(kv->set_gradient_compression({{"type", "3bit"}}), InvalidArgument);
  EXPECT_THROW(kv->set_gradient_compression({{"threshold", "-1"}}), InvalidArgument);
  EXPECT_THROW(kv->set_gradient_compression({{"ratio", "1"}}), InvalidArgument);
  kv->set_gradient_compression({{"type", "none"}});
  kv->init(1, Array::full({2}, 0));
  Array g = Array::full({2}, 0.3), out({2}, DType::kFloat32);
  kv->pushpull(1, g, out);
  EXPECT_EQ(values(out), filled(2, get_element(g, 0)));  // not quantised
}

INSTANTIATE_TEST_SUITE_P(Types, KVStoreTest,
                         ::testing::Values("local", "device", "local_update_cpu",
                                           "local_allreduce_cpu", "local_allreduce_device"));

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

// ---- Optimizer states through the store ----

class KVStoreStatesTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove(path_); }
  std::string path_ =
      (std::filesystem::temp_directory_path() / ("pp_kv_states_" + std::to_string(::getpid())))
          .string();
};

TEST_F(KVStoreStatesTest, SaveLoadContinuesBitExactly) {
  const auto spec = OptimizerSpec::parse("adam:learning_rate=0.01");
  auto a = create_kvstore("local");
  a->set_optimizer(spec);
  a->init(std::vector<Key>{0, 1}, {Array::full({3, 3}, 0.5), Array::full({7}, -1)});
  Array g0 = Array::full({3, 3}, 0.25), g1 = Array::full({7}, 2);
  for (int i = 0; i < 3; ++i)
    a->push(std::vector<Key>{0, 1}, std::vector<ArrayView>{g0, g1});
  a->save_optimizer_states(path_);

  auto b = create_kvstore("local");
  Array w0({3, 3}, DType::kFloat32), w1({7}, DType::kFloat32);
  a->pull(std::vector<Key>{0, 1}, std::vector<ArrayView>{w0, w1});
  b->init(std::vector<Key>{0, 1}, {w0, w1});
  EXPECT_THROW(b->load_optimizer_states(path_), InvalidArgument);  // no optimizer yet
  b->set_optimizer(spec);
  b->load_optimizer_states(path_);
  Array oa({7}, DType::kFloat32), ob({7}, DType::kFloat32);
  for (int i = 0; i < 2; ++i) {
    a->pushpull(1, g1, oa);
    b->pushpull(1, g1, ob);
    ASSERT_EQ(std::memcmp(oa.data(), ob.data(), oa.nbytes()), 0) << i;
  }
}

TEST_F(KVStoreStatesTest, SaveNeedsAnOptimizer) {
  auto kv = create_kvstore("local");
  EXPECT_THROW(kv->save_optimizer_states(path_), InvalidArgument);
  kv->set_updater([](const Key&, const ArrayView&, const ArrayView&) {});
  EXPECT_THROW(kv->save_optimizer_states(path_), InvalidArgument);
  EXPECT_THROW(kv->set_optimizer(OptimizerSpec::parse("sgd:beta1=0.9")), InvalidArgument);
}

TEST_F(KVStoreStatesTest, CorruptFileNamesTheFile) {
  auto kv = create_kvstore("local");
  kv->set_optimizer(OptimizerSpec::parse("sgd"));
  { std::ofstream(path_) << "garbage"; }
  try {
    kv->load_optimizer_states(path_);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path_));
  }
}

}  // namespace
}  // namespace pushpull
