// SPDX-License-Identifier: Apache-2.0
// GradientReducer (include/pushpull/frontend/gradient_reducer.h) alone, no
// torch: readiness with backward_passes_per_step, groups, the refusal of a
// pass too many, averages with predivide, fp16, process sets and the 2bit
// residual carried from step to step, over in-process groups of threads.
#include "pushpull/frontend/gradient_reducer.h"

#include <gtest/gtest.h>

#include <vector>

#include "collective/harness.h"
#include "transport/inproc/inprocess_transport.h"

namespace pushpull::frontend {
namespace {

using collective::Communicator;
using collective::CommunicatorOptions;
using collective::Reduction;
using collective::testing::on_threads;
using transport::InProcessFabric;

std::vector<std::unique_ptr<Communicator>> group_of(int n) {
  InProcessFabric fabric(n);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r)
    comms.push_back(std::make_unique<Communicator>(fabric.endpoint(r), CommunicatorOptions{}));
  return comms;
}

// Options with `set` applied to the defaults.
template <typename F>
ReducerOptions with(F set) {
  ReducerOptions o;
  set(o);
  return o;
}

TEST(GradientReducer, CountsPassesRefusesOneTooManyAndStartsGroupsWhole) {
  auto comms = group_of(1);
  // Declared before the reducer: the round abandoned below is still in
  // flight when the test ends, and the reducer's destructor waits for it
  // while the gradients it reads must stay alive (gradient_reducer.h).
  std::vector<std::vector<float>> g(5, std::vector<float>(3, 2.0f));
  ReducerOptions o;
  o.backward_passes_per_step = 2;
  o.num_groups = 2;  // 5 parameters: {0, 1, 2} and {3, 4}
  GradientReducer r(*comms[0], {"a", "b", "c", "d", "e"}, o);
  EXPECT_EQ(r.group_of(0), 0);
  EXPECT_EQ(r.group_of(2), 0);
  EXPECT_EQ(r.group_of(3), 1);
  EXPECT_TRUE(r.grad_ready(3).empty());  // first pass
  EXPECT_TRUE(r.grad_ready(3).empty());  // last pass, but 4 is not ready
  EXPECT_TRUE(r.grad_ready(4).empty());
  EXPECT_EQ(r.grad_ready(4), (std::vector<size_t>{3, 4}));
  EXPECT_THROW(r.before_accumulate(3), InvalidArgument);
  EXPECT_NO_THROW(r.before_accumulate(0));
  // The rest, group 0 whole, in order.
  EXPECT_EQ(r.take_unsubmitted(), (std::vector<size_t>{0, 1, 2}));
  for (size_t i = 0; i < 5; ++i)
    r.submit(i, ArrayView(g[i].data(), Shape{3}));
  EXPECT_TRUE(r.pending());
  r.synchronize();
  EXPECT_FALSE(r.pending());
  EXPECT_FLOAT_EQ(g[4][1], 2.0f);  // average of one rank
  EXPECT_EQ(r.stats().hook_reductions, 2);
  EXPECT_EQ(r.stats().sync_reductions, 3);
  EXPECT_NO_THROW(r.before_accumulate(3));  // a new round
  // An elastic reset ends a round without waiting: everything starts afresh.
  EXPECT_EQ(r.grad_ready(0), std::vector<size_t>{});
  EXPECT_EQ(r.grad_ready(0), std::vector<size_t>{});
  EXPECT_EQ(r.grad_ready(1), std::vector<size_t>{});
  EXPECT_EQ(r.grad_ready(1), std::vector<size_t>{});
  EXPECT_EQ(r.grad_ready(2), std::vector<size_t>{});
  ASSERT_EQ(r.grad_ready(2), (std::vector<size_t>{0, 1, 2}));
  for (size_t i = 0; i < 3; ++i)
    r.submit(i, ArrayView(g[i].data(), Shape{3}));
  r.abandon_round();
  EXPECT_FALSE(r.pending());
  EXPECT_NO_THROW(r.before_accumulate(0));
  EXPECT_EQ(r.take_unsubmitted().size(), 5u);
}

TEST(GradientReducer, RefusesBadOptionsAndABadGradientWithoutLosingTheParameter) {
  auto comms = group_of(1);
  auto make = [&](ReducerOptions o, std::vector<std::string> names = {"a"}) {
    GradientReducer r(*comms[0], std::move(names), std::move(o));
  };
  EXPECT_THROW(make(with([](auto& o) { o.backward_passes_per_step = 0; })), InvalidArgument);
  EXPECT_THROW(make(with([](auto& o) { o.op = Reduction::kMax; })), InvalidArgument);
  EXPECT_THROW(make(with([](auto& o) {
                 o.op = Reduction::kSum;
                 o.gradient_predivide_factor = 2;
               })),
               InvalidArgument);
  EXPECT_THROW(make(with([](auto& o) { o.process_set = {0, 0}; })), InvalidArgument);
  EXPECT_THROW(make(with([](auto& o) { o.process_set = {1}; })), InvalidArgument);
  EXPECT_THROW(make(ReducerOptions{}, {"a", "a"}), InvalidArgument);
  EXPECT_THROW(make(with([](auto& o) { o.groups = {{0}, {0}}; })), InvalidArgument);
  EXPECT_THROW(make(with([](auto& o) { o.groups = {{3}}; })), InvalidArgument);
  EXPECT_THROW(make(with([](auto& o) {
                 o.compression = GradCompression::kTwoBit;
                 o.compression_threshold = -1;
               })),
               InvalidArgument);

  GradientReducer r(*comms[0], {"a"}, ReducerOptions{});
  std::vector<int32_t> ints(2, 1);
  ASSERT_EQ(r.grad_ready(0), (std::vector<size_t>{0}));
  EXPECT_THROW(r.submit(0, ArrayView(ints.data(), Shape{2})), InvalidArgument);
  // Handed out again, then reduced.
  ASSERT_EQ(r.take_unsubmitted(), (std::vector<size_t>{0}));
  std::vector<double> g{1.5, -2};
  r.submit(0, ArrayView(g.data(), Shape{2}));
  r.synchronize();
  EXPECT_DOUBLE_EQ(g[1], -2);
}

// Rank r's gradient value at step s.
float grad_value(int r, int s) {
  return static_cast<float>(r + 1) * 0.25f + static_cast<float>(s);
}

TEST(GradientReducer, AveragesWithPredivideAndFp16OverFourRanks) {
  constexpr int n = 4;
  auto comms = group_of(n);
  on_threads(n, [&](int rank) {
    for (auto c : {GradCompression::kNone, GradCompression::kFp16}) {
      GradientReducer r(*comms[rank], {"w", "b"}, with([&](auto& o) {
        o.name_prefix = "t.";
        o.compression = c;
        o.gradient_predivide_factor = 4;
      }));
      std::vector<float> w(5, grad_value(rank, 1));
      std::vector<double> b(1, grad_value(rank, 2));
      for (size_t i : r.grad_ready(1))
        r.submit(i, ArrayView(b.data(), Shape{1}));
      for (size_t i : r.take_unsubmitted())
        r.submit(i, ArrayView(w.data(), Shape{5}));
      r.synchronize();
      // mean over ranks of (r + 1) / 4 + s = 0.625 + s (exact in float16 too).
      EXPECT_FLOAT_EQ(w[4], 1.625f);
      EXPECT_DOUBLE_EQ(b[0], 2.625);
    }
  });
}

TEST(GradientReducer, AProcessSetAveragesAmongItsMembersAndOthersStepLocally) {
  constexpr int n = 3;
  auto comms = group_of(n);
  on_threads(n, [&](int rank) {
    GradientReducer r(*comms[rank], {"w"}, with([](auto& o) {
      o.average_aggregated_gradients = true;
      o.backward_passes_per_step = 2;
      o.process_set = {0, 2};
    }));
    std::vector<float> w(4, grad_value(rank, 0) * 2);  // two passes accumulated
    EXPECT_EQ(r.active(), rank != 1);
    EXPECT_TRUE(r.grad_ready(0).empty());
    for (size_t i : r.grad_ready(0))
      r.submit(i, ArrayView(w.data(), Shape{4}));
    for (size_t i : r.take_unsubmitted())
      r.submit(i, ArrayView(w.data(), Shape{4}));
    r.synchronize();
    if (rank == 1) {
      EXPECT_DOUBLE_EQ(r.local_scale(), 0.5);  // the binding's to apply
      EXPECT_FLOAT_EQ(w[0], 1.0f);
    } else {
      EXPECT_FLOAT_EQ(w[0], (0.25f + 0.75f) / 2);  // ranks 0 and 2, passes averaged
    }
  });
}

TEST(GradientReducer, TwoBitCarriesTheResidualToTheNextStep) {
  constexpr int n = 2;
  auto comms = group_of(n);
  on_threads(n, [&](int rank) {
    GradientReducer r(*comms[rank], {"w"}, with([](auto& o) {
      o.op = Reduction::kSum;
      o.compression = GradCompression::kTwoBit;
    }));
    // 0.3 is below the threshold 0.5: step 1 sends 0 and keeps 0.3; step 2
    // sends +0.5 for 0.3 + 0.3 and keeps 0.1.
    for (float expect : {0.0f, 1.0f}) {
      std::vector<float> w(3, 0.3f);
      w[2] = rank == 0 ? 0.6f : -0.6f;  // +t and -t at once: summed to 0
      for (size_t i : r.take_unsubmitted())
        r.submit(i, ArrayView(w.data(), Shape{3}));
      r.synchronize();
      EXPECT_FLOAT_EQ(w[0], expect);
      EXPECT_FLOAT_EQ(w[2], 0.0f);
    }
  });
}

}  // namespace
}  // namespace pushpull::frontend
