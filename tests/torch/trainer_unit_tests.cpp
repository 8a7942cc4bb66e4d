// SPDX-License-Identifier: Apache-2.0
// Tests of pushpull::torch::Trainer in one process: init, packing, pushes
// from hooks, statistics, accumulation, the error cases, and the
// multi-device helpers (ReplicaRunner, batch slices). Part of
// torch_trainer_test (main and the equivalence setups: trainer_tests.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/kvstore.h"
#include "pushpull/torch/replicas.h"
#include "pushpull/torch/trainer.h"
#include "trainer_fixture.h"

namespace {

using namespace trainer_test;

// ---- Hooks, stats, init ----

template <typename F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no InvalidArgument (expected one mentioning '" << needle << "')";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Trainer, InitMakesEveryReplicaStartFromReplicaZero) {
  auto kv = pushpull::create_kvstore("local");
  auto m0 = make_model(1), m1 = make_model(2);
  const auto w0 = clone_all(m0->parameters());
  ASSERT_FALSE(torch::equal(m1->parameters()[0], w0[0]));
  Trainer trainer(Replicas{m0->parameters(), m1->parameters()}, OptimizerSpec::parse("sgd"), *kv);
  trainer.init();
  trainer.init();  // idempotent
  expect_close(clone_all(m1->parameters()), w0, "replica 1");
  EXPECT_EQ(trainer.num_devices(), 2);
  EXPECT_EQ(trainer.num_parameters(), w0.size());
}

// Parameters of 40, 40, 4000 and 40 bytes, packing below 4000: the small ones
// go in order into keys of their first parameter; an exact SGD step either way.
TEST(Trainer, PacksSmallParametersInOrderUnderTheirFirstKey) {
  auto make_params = [] {
    std::vector<torch::Tensor> ps;
    for (int64_t numel : {10, 10, 1000, 10})
      ps.push_back(torch::arange(numel, torch::kFloat).requires_grad_());
    return ps;
  };
  auto keys_of = [&](TrainerOptions o) {
    auto kv = pushpull::create_kvstore("local");
    Trainer t(Replicas{make_params()}, OptimizerSpec::parse("sgd"), *kv, o);
    std::vector<int64_t> ks;
    for (const auto& k : t.keys())
      ks.push_back(k.as_int());
    return ks;
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(keys_of({.fuse_below = 4000}), (V{0, 2}));
  EXPECT_EQ(keys_of({.fuse_below = 4000, .bucket_bytes = 80}), (V{0, 2, 3}));
  EXPECT_EQ(keys_of({.fuse_below = 0}), (V{0, 1, 2, 3}));
  EXPECT_EQ(keys_of({.key_base = 10, .fuse_below = 4000}), (V{10, 12}));
  EXPECT_EQ(keys_of({}), (V{0}));  // all under the 256 KiB default, one 1 MiB bucket

  for (bool on_store : {true, false}) {
    auto kv = pushpull::create_kvstore("local");
    auto ps = make_params();
    Trainer trainer(Replicas{ps}, OptimizerSpec::parse("sgd:learning_rate=0.5"), *kv,
                    {.update_on_kvstore = on_store, .key_base = 10, .fuse_below = 4000});
    for (int step = 0; step < 3; ++step) {  // the first from step(), then from hooks
      torch::Tensor loss = torch::zeros({});
      for (size_t i = 0; i < ps.size(); ++i)
        loss = loss + (ps[i] * static_cast<double>(i + 1)).sum();
      loss.backward();
      trainer.step(2);  // rescale_grad 1/2: each step moves p_i by 0.25 (i + 1)
      for (auto& p : ps)
        p.mutable_grad().zero_();
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      auto want = torch::arange(ps[i].numel(), torch::kFloat) - 3 * 0.25 * double(i + 1);
      EXPECT_TRUE(torch::allclose(ps[i].detach(), want))
          << "parameter " << i << (on_store ? ", store update" : ", local update");
    }
    EXPECT_EQ(trainer.stats().hook_pushes, 2 * 2);  // 2 keys, steps 2 and 3
  }
  auto kv = pushpull::create_kvstore("local");
  expect_invalid(
      [&] {
        Trainer(Replicas{make_params()}, OptimizerSpec::parse("sgd"), *kv,
                TrainerOptions{.fuse_below = -1});
      },
      "fuse_below");
}

TEST(Trainer, PushesFromHooksAfterTheFirstStep) {
  auto kv = pushpull::create_kvstore("local");
  auto m = make_model(1);
  Trainer trainer(m->parameters(), OptimizerSpec::parse("sgd:learning_rate=0.1"), *kv);
  const Data data = make_data(1);
  for (int s = 0; s < 3; ++s) {
    loss_sum(m, data.x[s], data.y[s]).backward();
    trainer.step(kShard);
    m->zero_grad();
  }
  const auto st = trainer.stats();
  const auto n = static_cast<int64_t>(trainer.keys().size());
  EXPECT_EQ(n, 1);  // the model's four small parameters, packed
  EXPECT_EQ(st.steps, 3);
  EXPECT_EQ(st.step_pushes, n);      // the first step (the store's optimizer is set there)
  EXPECT_EQ(st.hook_pushes, 2 * n);  // then every key as soon as its gradients were ready
  EXPECT_GE(st.wait_seconds, 0.0);
}

TEST(Trainer, SecondBackwardBeforeStepIsAnError) {
  auto kv = pushpull::create_kvstore("local");
  auto m = make_model(1);
  Trainer trainer(m->parameters(), OptimizerSpec::parse("sgd"), *kv);
  const Data data = make_data(1);
  loss_sum(m, data.x[0], data.y[0]).backward();
  trainer.step(kShard);
  loss_sum(m, data.x[1], data.y[1]).backward();
  try {
    loss_sum(m, data.x[2], data.y[2]).backward();
    FAIL() << "a second backward before step() was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("push_from_hooks"), std::string::npos) << e.what();
  }
}

TEST(Trainer, AccumulatesOverSeveralBackwardsWithoutHooks) {
  // Two half batches accumulated then one step == one step on the whole batch.
  const auto ref = reference_weights(2);
  auto kv = pushpull::create_kvstore("local");
  auto m = make_model(1);
  Trainer trainer(Replicas{m->parameters()}, OptimizerSpec::parse("sgd:learning_rate=0.5"), *kv,
                  TrainerOptions{.update_on_kvstore = false, .push_from_hooks = false});
  const Data data = make_data(2);
  for (int s = 0; s < kSteps; ++s) {
    for (int h = 0; h < 2; ++h) {
      loss_sum(m, data.x[s].narrow(0, h * kShard, kShard), data.y[s].narrow(0, h * kShard, kShard))
          .backward();
    }
    trainer.step(2 * kShard);
    m->zero_grad();
  }
  expect_close(clone_all(m->parameters()), ref, "accumulated");
}

// ---- Error cases ----

TEST(TrainerErrors, RejectsBadParameters) {
  auto kv = pushpull::create_kvstore("local");
  auto sgd = OptimizerSpec::parse("sgd");
  auto make = [&](torch::Tensor t) { Trainer(std::vector<torch::Tensor>{t}, sgd, *kv); };
  expect_invalid([&] { make(torch::zeros({3}, torch::kDouble).requires_grad_()); }, "float32");
  expect_invalid([&] { make(torch::zeros({3, 4}).t().requires_grad_()); }, "not contiguous");
  expect_invalid([&] { make(torch::zeros({3})); }, "requires grad");
  expect_invalid([&] { make(torch::Tensor()); }, "undefined");
  expect_invalid([&] { Trainer(std::vector<torch::Tensor>{}, sgd, *kv); }, "no parameters");
  auto a = torch::zeros({3}).requires_grad_();
  expect_invalid([&] { Trainer(Replicas{{a}, {a}}, sgd, *kv); }, "shares its memory");
  auto b = torch::zeros({4}).requires_grad_();
  expect_invalid([&] { Trainer(Replicas{{a}, {b}}, sgd, *kv); }, "same shapes");
  expect_invalid([&] { Trainer(Replicas{{a}, {}}, sgd, *kv); }, "replica 1 has 0 parameters");
  expect_invalid(
      [&] { Trainer(std::vector<torch::Tensor>{a}, OptimizerSpec::parse("sgd:nonsense=1"), *kv); },
      "nonsense");
}

TEST(TrainerErrors, RejectsMissingAndBadGradients) {
  auto kv = pushpull::create_kvstore("local");
  auto used = torch::ones({2}).requires_grad_();
  auto unused = torch::ones({2}).requires_grad_();
  Trainer trainer(std::vector<torch::Tensor>{used, unused}, OptimizerSpec::parse("sgd"), *kv);
  (used * 3).sum().backward();
  expect_invalid([&] { trainer.step(1); }, "parameter 1 (packed in key 0) of replica 0");
  expect_invalid([&] { trainer.step(0); }, "batch_size");
  unused.mutable_grad() = torch::zeros({2}, torch::kDouble);
  expect_invalid([&] { trainer.step(1); }, "float32");
  unused.mutable_grad() = torch::zeros({4, 2}).t().narrow(0, 0, 1).squeeze(0);
  expect_invalid([&] { trainer.step(1); }, "gradient of parameter 1");
  // A good step still works after the errors, and nothing was lost.
  unused.mutable_grad() = torch::zeros({2});
  trainer.step(1);
  EXPECT_TRUE(torch::allclose(used.detach(), torch::full({2}, 1.0 - 0.01 * 3)));
}

// ---- Multi-device helpers ----

TEST(ReplicaRunner, RunsEveryDeviceAndRethrows) {
  ReplicaRunner runner(3);
  std::vector<int> hits(3, 0);
  for (int r = 0; r < 5; ++r)
    runner.run([&](int d) { ++hits[d]; });
  EXPECT_EQ(hits, (std::vector<int>{5, 5, 5}));
  EXPECT_THROW(runner.run([](int d) {
    if (d == 2) throw InvalidArgument("device 2 failed");
  }),
               InvalidArgument);
  runner.run([&](int d) { ++hits[d]; });  // still usable
  EXPECT_EQ(hits[2], 6);
  EXPECT_THROW(ReplicaRunner(0), InvalidArgument);
}

TEST(ReplicaRunner, BatchSlicesCoverTheBatch) {
  for (int64_t batch : {1, 7, 64, 65}) {
    for (int k : {1, 2, 3, 4}) {
      int64_t next = 0;
      for (int d = 0; d < k; ++d) {
        auto [b, e] = pushpull::torch::batch_slice(batch, k, d);
        EXPECT_EQ(b, next);
        EXPECT_LE(e - b, batch / k + 1);
        EXPECT_GE(e - b, batch / k);
        next = e;
      }
      EXPECT_EQ(next, batch);
    }
  }
  EXPECT_THROW(pushpull::torch::batch_slice(8, 2, 2), InvalidArgument);
}

}  // namespace
