// SPDX-License-Identifier: Apache-2.0
// TrainerCore (include/pushpull/frontend/trainer_core.h), the Trainers' step
// without torch, over a local store: init order, the first step's rescale,
// the local update on the right keys, the framework's optimizer's summed
// gradients, hooks' pushes, and a bad gradient that changes nothing.
#include "pushpull/frontend/trainer_core.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <tuple>
#include <vector>

#include "pushpull/error.h"

namespace pushpull::frontend {
namespace {

using Ready = PushSchedule::Ready;

// Parameters of 3, 2 and 20 floats: with fuse_below = 64 bytes the first two
// are packed under key base + 0, the third is key base + 2.
const std::vector<Shape> kShapes = {Shape{3}, Shape{2}, Shape{4, 5}};

struct FakeTensors : TrainerTensors {
  explicit FakeTensors(int replicas) {
    for (int d = 0; d < replicas; ++d) {
      w.emplace_back();
      g.emplace_back();
      for (size_t i = 0; i < kShapes.size(); ++i) {
        const auto n = static_cast<size_t>(kShapes[i].numel());
        w.back().emplace_back(n);
        g.back().emplace_back(n);
        for (size_t e = 0; e < n; ++e) {
          w[d][i][e] = static_cast<float>(10 * d + i) + 0.5f * static_cast<float>(e);
          g[d][i][e] = static_cast<float>(d + 1) * static_cast<float>(i + 1 + e);
        }
      }
    }
  }
  ArrayView weight(size_t i, int d) override { return ArrayView(w[d][i].data(), kShapes[i]); }
  ArrayView gradient(size_t i, int d) override {
    if (i == bad) throw InvalidArgument("no gradient");
    return ArrayView(g[d][i].data(), kShapes[i]);
  }
  void blocking(const std::function<void()>& call) override {
    ++blocked;
    call();
  }
  void batch_changed(int64_t batch, int64_t first, int workers) override {
    changes.emplace_back(batch, first, workers);
  }
  std::vector<std::vector<std::vector<float>>> w, g;  // [replica][parameter][element]
  size_t bad = SIZE_MAX;
  int blocked = 0;
  std::vector<std::tuple<int64_t, int64_t, int>> changes;
};

struct Rig {
  explicit Rig(int replicas, TrainerCoreOptions o, const char* spec = "sgd:learning_rate=1")
      : kv(create_kvstore("local")), t(replicas) {
    o.fuse_below = 64;
    o.key_base = 7;
    core = std::make_unique<TrainerCore>([this]() -> KVStore& { return *kv; },
                                         OptimizerSpec::parse(spec), kShapes, replicas, o, t);
  }
  std::unique_ptr<KVStore> kv;
  FakeTensors t;
  std::unique_ptr<TrainerCore> core;
};

TEST(TrainerCore, InitStoresReplicaZeroPackedAndPullsItIntoEveryReplica) {
  Rig r(2, {});
  ASSERT_EQ(r.core->units().size(), 2u);
  EXPECT_EQ(r.core->units()[0].key, 7);  // parameters 0 and 1 packed
  EXPECT_EQ(r.core->units()[1].key, 9);
  EXPECT_EQ(r.core->key_label(1), "packed in key 7");
  const auto w0 = r.t.w[0];
  r.core->init();
  r.core->init();  // idempotent
  EXPECT_EQ(r.t.blocked, 1);
  for (int d = 0; d < 2; ++d)
    EXPECT_EQ(r.t.w[d], w0) << "replica " << d;
  // The packed key holds parameter 0 then parameter 1, flat.
  std::vector<float> flat(5);
  r.kv->pull(Key(7), ArrayView(flat.data(), Shape{5}));
  EXPECT_EQ(flat, (std::vector<float>{0, 0.5f, 1, 1, 1.5f}));
}

TEST(TrainerCore, UpdateOnTheStoreRescalesOnceAtTheFirstStep) {
  TrainerCoreOptions o;
  o.scale = 2;
  Rig r(2, o, "sgd:learning_rate=1,rescale_grad=0.5");
  r.core->init();
  auto expect = r.t.w[0];
  r.core->step(4);  // rescale_grad = 0.5 * 2 / (4 * 1 worker) = 0.25
  for (size_t i = 0; i < kShapes.size(); ++i)
    for (size_t e = 0; e < expect[i].size(); ++e)
      expect[i][e] -= 0.25f * (r.t.g[0][i][e] + r.t.g[1][i][e]);  // replicas summed
  for (int d = 0; d < 2; ++d)
    for (size_t i = 0; i < kShapes.size(); ++i)
      for (size_t e = 0; e < expect[i].size(); ++e)
        EXPECT_FLOAT_EQ(r.t.w[d][i][e], expect[i][e]) << d << " " << i << " " << e;
  r.core->step(8);  // still 0.25: the store keeps the first step's scale
  for (size_t e = 0; e < expect[2].size(); ++e)
    EXPECT_FLOAT_EQ(r.t.w[1][2][e], expect[2][e] - 0.25f * (r.t.g[0][2][e] + r.t.g[1][2][e]));
  ASSERT_EQ(r.t.changes.size(), 1u);
  EXPECT_EQ(r.t.changes[0], std::make_tuple(int64_t{8}, int64_t{4}, 1));
  EXPECT_EQ(r.core->stats().steps, 2);
  EXPECT_EQ(r.core->stats().step_pushes, 4);  // 2 keys, 2 steps
}

TEST(TrainerCore, LocalUpdateScalesTheSumAndUpdatesEveryKeyOnEveryReplica) {
  TrainerCoreOptions o;
  o.update_on_kvstore = false;
  Rig r(2, o, "sgd:learning_rate=1");
  r.core->init();
  auto expect = r.t.w[0];
  r.core->step(2);  // summed gradients scaled by 1 / (2 * 1 worker)
  for (int d = 0; d < 2; ++d)
    for (size_t i = 0; i < kShapes.size(); ++i)
      for (size_t e = 0; e < expect[i].size(); ++e)
        EXPECT_FLOAT_EQ(r.t.w[d][i][e], expect[i][e] - 0.5f * (r.t.g[0][i][e] + r.t.g[1][i][e]))
            << d << " " << i << " " << e;
  EXPECT_THROW(Rig(1, {}).core->summed(0), InvalidArgument);  // on the store
}

TEST(TrainerCore, TheFrameworksOptimizerReadsTheScaledSums) {
  TrainerCoreOptions o;
  o.update_on_kvstore = false;
  o.local_optimizer = false;
  Rig r(2, o, "sgd");  // not used
  const auto w0 = r.t.w[0];
  r.core->step(4);  // init first
  EXPECT_EQ(r.t.w[0], w0);
  EXPECT_EQ(r.t.w[1], w0);
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const ArrayView s = r.core->summed(i);
    ASSERT_EQ(s.shape, kShapes[i]);
    for (size_t e = 0; e < r.t.g[0][i].size(); ++e)
      EXPECT_FLOAT_EQ(s.as<float>()[e], (r.t.g[0][i][e] + r.t.g[1][i][e]) * 0.25f);
  }
}

TEST(TrainerCore, HooksPushEachKeyOnceItIsCompleteFromTheSecondStep) {
  Rig r(2, {});
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(r.core->grad_ready(i), Ready::kWait);  // the first step pushes everything
  r.core->step(1);
  EXPECT_EQ(r.core->grad_ready(2), Ready::kWait);  // replica 0
  EXPECT_EQ(r.core->grad_ready(2), Ready::kPush);  // replica 1: key 9 goes
  EXPECT_EQ(r.core->grad_ready(2), Ready::kSecond);
  for (int d = 0; d < 2; ++d)
    EXPECT_EQ(r.core->grad_ready(0), Ready::kWait);
  EXPECT_EQ(r.core->grad_ready(1), Ready::kWait);
  EXPECT_EQ(r.core->grad_ready(1), Ready::kPush);  // key 7's last member
  const auto before = r.t.w[0];
  r.core->step(1);
  const auto s = r.core->stats();
  EXPECT_EQ(s.hook_pushes, 2);
  EXPECT_EQ(s.step_pushes, 2);  // the first step's
  EXPECT_NE(r.t.w[0], before);  // the hooks' results were applied
  EXPECT_EQ(r.t.w[0], r.t.w[1]);
  EXPECT_FALSE(r.core->in_flight());
}

TEST(TrainerCore, ABadGradientPushesNothingAndTheNextRoundStartsClean) {
  Rig r(1, {});
  r.core->init();
  const auto w0 = r.t.w[0];
  r.t.bad = 2;
  EXPECT_THROW(r.core->step(1), InvalidArgument);
  EXPECT_EQ(r.core->stats().step_pushes, 0);
  EXPECT_EQ(r.t.w[0], w0);
  r.t.bad = SIZE_MAX;
  // A view of the wrong size is refused, not copied.
  EXPECT_THROW(
      {
        struct Small : FakeTensors {
          using FakeTensors::FakeTensors;
          ArrayView gradient(size_t i, int d) override {
            return i == 1 ? ArrayView(g[d][i].data(), Shape{1}) : FakeTensors::gradient(i, d);
          }
        } small(1);
        TrainerCore c([&]() -> KVStore& { return *r.kv; }, OptimizerSpec::parse("sgd"), kShapes, 1,
                      {.key_base = 50, .fuse_below = 64}, small);
        c.step(1);
      },
      InvalidArgument);
  r.core->step(1);  // the round after a failed step works
  EXPECT_EQ(r.core->stats().steps, 1);
  EXPECT_THROW(r.core->step(0), InvalidArgument);
  TrainerCoreOptions bad;
  bad.scale = 0;
  EXPECT_THROW(Rig(1, bad), InvalidArgument);
  EXPECT_THROW(Rig(1, {}, "nosuchoptimizer"), InvalidArgument);
}

}  // namespace
}  // namespace pushpull::frontend
