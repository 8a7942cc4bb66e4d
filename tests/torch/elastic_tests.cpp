// SPDX-License-Identifier: Apache-2.0
// pushpull::torch::elastic in one process (a world of one over the default
// session): TorchState's commit / restore of weights, optimizer state and
// plain values, and run() re-forming the session and rebuilding the tracked
// DistributedOptimizer after a member's failure. Whole elastic jobs of
// examples/lenet --elastic: python/tests/elastic_job.py --program lenet.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pushpull/collective.h"
#include "pushpull/torch/elastic.h"

namespace pushpull::torch::elastic {
namespace {

struct DefaultSession {
  DefaultSession() { collective::init(Options{}); }
  ~DefaultSession() { collective::shutdown(); }
};

TEST(TorchElastic, RestoreUndoesEverythingSinceTheCommit) {
  DefaultSession s;
  ::torch::manual_seed(1);
  ::torch::nn::Linear model(3, 2);
  ::torch::optim::SGD sgd(model->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
  ElasticDistributedOptimizer opt(sgd, named(model->named_parameters()));
  TorchState state(*model, sgd);
  int64_t epoch = 3;
  state.add_value("epoch", &epoch);
  auto step = [&] {
    opt.zero_grad();
    model->forward(::torch::ones({4, 3})).sum().backward();
    opt.step();
  };
  step();
  state.commit();
  const auto w = model->weight.detach().clone();
  step();
  step();
  epoch = 9;
  ASSERT_FALSE(::torch::equal(model->weight, w));
  state.restore();
  EXPECT_TRUE(::torch::equal(model->weight, w));
  EXPECT_EQ(epoch, 3);
  // The momentum buffer is the committed one too: the next step from here
  // is the same as the one taken right after the commit the first time.
  step();
  const auto after_restore = model->weight.detach().clone();
  state.restore();
  step();
  EXPECT_TRUE(::torch::allclose(model->weight, after_restore));
}

TEST(TorchElastic, RunReformsAndRebuildsTheOptimizerAfterAFailure) {
  DefaultSession s;
  ::torch::manual_seed(2);
  ::torch::nn::Linear model(2, 1);
  ::torch::optim::SGD sgd(model->parameters(), ::torch::optim::SGDOptions(0.05));
  ElasticDistributedOptimizer opt(sgd, named(model->named_parameters()));
  TorchState state(*model, sgd);
  int64_t steps = 0;
  state.add_value("steps", &steps);
  state.track(opt);
  int resets = 0, attempts = 0;
  state.register_reset_callbacks({[&] { ++resets; }});
  run(state, [&] {
    ++attempts;
    for (; steps < 10; ++steps) {
      opt.zero_grad();
      model->forward(::torch::ones({1, 2})).sum().backward();
      opt.step();
      if (steps % 2 == 1) state.commit();
      if (attempts == 1 && steps == 6) throw PeerFailure("rank 1 died");
    }
  });
  EXPECT_EQ(attempts, 2);
  EXPECT_EQ(resets, 1);
  EXPECT_EQ(steps, 10);
  EXPECT_TRUE(collective::is_initialized());  // re-formed
  EXPECT_NO_THROW(opt.step());
}

}  // namespace
}  // namespace pushpull::torch::elastic
