// SPDX-License-Identifier: Apache-2.0
// The store conformance suite (conformance_test.cpp says what it holds every
// type to), continued: optimizer updates like MXNet's sgd with momentum,
// updaters (local types) or their refusal (parameter servers), optimizer
// states saved and loaded, a corrupt state file, row-sparse pulls, and
// async handles with wait_all.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "conformance.h"
#include "pushpull/error.h"

namespace pushpull {
namespace {

using ::testing::HasSubstr;
using namespace conformance_testing;
using testing::is_dist_ps;

// MXNet 1.x's sgd with momentum, the same closed form on every type: every
// worker pushes g1 + g2 per round (async: one worker pushes, so each push is
// its round).
TEST_P(Conformance, OptimizerUpdatesLikeSgdWithMomentum) {
  run([&](KVStore& kv) {
    const int n = kv.num_workers();
    kv.init("w", Array::full({3}, 1.0).view());
    kv.set_optimizer(OptimizerSpec::parse("sgd:learning_rate=0.5,momentum=0.5,rescale_grad=0.5"));
    Array g1 = Array::full({3}, 1), g2 = Array::full({3}, 3), out({3}, DType::kFloat32);
    const int pushers = async() ? 1 : n;
    double w = 1, mom = 0;
    for (int step = 0; step < 3; ++step) {
      if (!async() || kv.rank() == 0) kv.push("w", ArrayList{g1, g2});
      kv.barrier();
      kv.pull("w", out.view());
      mom = 0.5 * mom - 0.5 * (0.5 * 4 * pushers);
      w += mom;
      EXPECT_EQ(values_of(out), filled(3, w)) << step;
      kv.barrier();
    }
  });
}

// Local updaters run where the values are; parameter servers cannot run a
// C++ function, so PS types refuse it (set_optimizer is the way there).
TEST_P(Conformance, UpdaterSeesTheSumOrIsRefused) {
  run([&](KVStore& kv) {
    const int n = kv.num_workers();
    kv.init(7, Array::full({5}, 10, DType::kInt32).view());
    auto updater = [](const Key&, const ArrayView& summed, const ArrayView& stored) {
      for (int64_t i = 0; i < stored.numel(); ++i)
        set_element(stored, i, get_element(stored, i) + 2 * get_element(summed, i));
    };
    if (is_dist_ps(type_)) {
      EXPECT_THROW(kv.set_updater(updater), InvalidArgument);
      return;
    }
    kv.set_updater(updater);
    Array g1 = Array::full({5}, 1, DType::kInt32), g2 = Array::full({5}, 2, DType::kInt32);
    Array out({5}, DType::kInt32);
    kv.pushpull(7, ArrayList{g1, g2}, ArrayList{out});
    EXPECT_EQ(values_of(out), filled(5, 10 + 2 * 3 * n));
    kv.set_updater(nullptr);  // back to "replace"
    kv.pushpull(7, g1.view(), out.view());
    EXPECT_EQ(values_of(out), filled(5, n));
    // An updater's exception reaches the push's caller.
    kv.set_updater([](const Key& k, const ArrayView&, const ArrayView&) {
      throw InvalidArgument("updater refused key " + k.to_string());
    });
    try {
      kv.push(7, g1.view());
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("refused key 7"));
    }
  });
}

// Save after two steps, then a new job from the weights after two steps and
// the loaded states makes the third step equal the first job's, bit for bit.
TEST_P(Conformance, OptimizerStatesSaveAndLoadContinueExactly) {
  const std::string path = temp_path("states");
  const auto spec = OptimizerSpec::parse("adam:learning_rate=0.01");
  Array after_two(Shape{2001}, DType::kFloat32), after_three(Shape{2001}, DType::kFloat32);
  // Every worker pushes the same gradient, so dist_async's order does not matter.
  auto step = [&](KVStore& kv) {
    kv.push(4, Array::full(Shape{2001}, 0.25).view());
    kv.barrier();
  };
  run([&](KVStore& kv) {
    kv.init(4, Array::full(Shape{2001}, 1.0).view());
    EXPECT_THROW(kv.save_optimizer_states(path), InvalidArgument);  // no optimizer yet
    kv.barrier();  // no worker sets the servers' optimizer before every save was refused
    kv.set_optimizer(spec);
    step(kv);
    step(kv);
    if (kv.rank() == 0) {
      kv.pull(4, after_two.view());
      kv.save_optimizer_states(path);
    }
    kv.barrier();
    step(kv);
    if (kv.rank() == 0) kv.pull(4, after_three.view());
  });
  run([&](KVStore& kv) {
    kv.init(4, after_two.view());
    EXPECT_THROW(kv.load_optimizer_states(path), InvalidArgument);  // no optimizer yet
    kv.barrier();
    kv.set_optimizer(spec);
    // Servers hold the states once (one worker loads); the other types run the
    // optimizer on every worker (each loads).
    if (!is_dist_ps(type_) || kv.rank() == 0) kv.load_optimizer_states(path);
    kv.barrier();
    step(kv);
    Array w(Shape{2001}, DType::kFloat32);
    kv.pull(4, w.view());
    EXPECT_EQ(std::memcmp(w.data(), after_three.data(), w.nbytes()), 0);
  });
  std::filesystem::remove(path);
}

TEST_P(Conformance, CorruptStateFileIsAnIoErrorNamingIt) {
  const std::string path = temp_path("garbage");
  { std::ofstream(path) << "garbage"; }
  run([&](KVStore& kv) {
    kv.init(1, Array::full({3}, 1.0).view());
    kv.set_optimizer(OptimizerSpec::parse("sgd:momentum=0.9"));
    try {
      kv.load_optimizer_states(path);
      ADD_FAILURE() << "accepted";
    } catch (const IoError& e) {
      EXPECT_THAT(e.what(), HasSubstr(path));
    }
    EXPECT_THROW(kv.load_optimizer_states(path + ".missing"), IoError);
  });
  std::filesystem::remove(path);
}

TEST_P(Conformance, RowSparsePullGivesListedRowsAndZeros) {
  run([&](KVStore& kv) {
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
        for (int64_t r = rows - 1; r >= 0; --r)  // any order
          ask.push_back(r);
      Array o1 = Array::full(Shape{rows, cols}, -7.0), o2 = Array::full(Shape{rows, cols}, -7.0);
      kv.row_sparse_pull(3, ArrayList{o1, o2},
                         ArrayView(ask.data(), Shape{static_cast<int64_t>(ask.size())}));
      for (int64_t r = 0; r < rows; ++r) {
        bool asked = std::find(ask.begin(), ask.end(), r) != ask.end();
        for (int64_t c = 0; c < cols; c += 13)
          ASSERT_EQ(o1.as<float>()[r * cols + c], asked ? static_cast<float>(r * cols + c) : 0.0f)
              << "row " << r << " case " << which;
      }
      EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.nbytes()), 0);
    }
    int32_t rows32[1] = {2};
    Array out(Shape{rows, cols}, DType::kFloat32);
    kv.row_sparse_pull(3, out.view(), ArrayView(rows32, {1}));
    EXPECT_EQ(out.as<float>()[2 * cols], 2.0f * cols);
    EXPECT_EQ(out.as<float>()[0], 0.0f);
    int64_t bad[1] = {rows};
    EXPECT_THROW(kv.row_sparse_pull(3, out.view(), ArrayView(bad, {1})), InvalidArgument);
    float frows[1] = {1};
    EXPECT_THROW(kv.row_sparse_pull(3, out.view(), ArrayView(frows, {1})), InvalidArgument);
    Array small({1, cols}, DType::kFloat32);
    EXPECT_THROW(kv.row_sparse_pull(3, small.view(), ArrayView(rows32, {1})), InvalidArgument);
  });
}

TEST_P(Conformance, AsyncHandlesAndWaitAll) {
  run([&](KVStore& kv) {
    const int n = kv.num_workers();
    std::vector<Key> keys{0, 1, 2};
    std::vector<Array> vals;
    for (int i = 0; i < 3; ++i)
      vals.push_back(Array::full({2001}, i, DType::kFloat64));
    kv.init(keys, std::vector<ArrayView>(vals.begin(), vals.end()));
    kv.set_optimizer(OptimizerSpec::parse("test"));
    std::vector<ArrayList> lists;
    for (auto& v : vals)
      lists.push_back(ArrayList{v.view()});
    KVHandle h = kv.push_async(keys, lists, 0);
    kv.wait(h);
    EXPECT_TRUE(h.done());
    kv.push_async(keys, lists, 0);
    kv.wait_all();
    kv.barrier();
    std::vector<Array> outs;
    for (int i = 0; i < 3; ++i)
      outs.emplace_back(Shape{2001}, DType::kFloat64);
    std::vector<ArrayList> out_lists;
    for (auto& o : outs)
      out_lists.push_back(ArrayList{o.view()});
    kv.wait(kv.pull_async(keys, out_lists, 0));
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(get_element(outs[static_cast<size_t>(i)], 2000), i + 2.0 * n * i) << i;
  });
}

INSTANTIATE_TEST_SUITE_P(Types, Conformance, ::testing::ValuesIn(kConformanceJobs));

}  // namespace
}  // namespace pushpull
