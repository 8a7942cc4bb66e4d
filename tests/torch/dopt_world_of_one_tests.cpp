// SPDX-License-Identifier: Apache-2.0
// pushpull::torch::DistributedOptimizer and the broadcasts in a world of one
// (collective::Session with nothing set), in process: steps like the plain
// optimizer with reductions from hooks, synchronize, accumulation, float64,
// the broadcasts' checks, and the error cases. Part of
// torch_distributed_optimizer_test (main: distributed_optimizer_tests.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "dopt_fixture.h"
#include "pushpull/collective.h"
#include "pushpull/error.h"
#include "pushpull/torch/distributed_optimizer.h"

namespace {

using namespace dopt_test;

struct WorldOfOne : testing::Test {
  Session session{pushpull::Options{}};
  Communicator& comm = session.communicator();
};

TEST_F(WorldOfOne, StepsLikeThePlainOptimizerWithReductionsFromHooks) {
  auto ref_model = make_model(1), model = make_model(1);
  torch::optim::SGD ref(ref_model->parameters(), torch::optim::SGDOptions(kLr).momentum(0.9));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(kLr).momentum(0.9));
  DistributedOptimizer opt(sgd, named(model->named_parameters()), comm);
  const Data data = make_data(1);
  for (int s = 0; s < kSteps; ++s) {
    ref.zero_grad();
    loss_mean(ref_model, data.x[s], data.y[s]).backward();
    ref.step();
    opt.zero_grad();
    loss_mean(model, data.x[s], data.y[s]).backward();
    opt.step();
  }
  for (size_t i = 0; i < model->parameters().size(); ++i)
    EXPECT_TRUE(torch::equal(model->parameters()[i], ref_model->parameters()[i])) << i;
  const auto st = opt.stats();
  const auto n = static_cast<int64_t>(opt.num_parameters());
  EXPECT_EQ(n, 4);
  EXPECT_EQ(st.steps, kSteps);
  EXPECT_EQ(st.hook_allreduces, kSteps * n);  // every gradient as soon as it was ready
  EXPECT_EQ(st.sync_allreduces, 0);
  EXPECT_GE(st.wait_seconds, 0.0);
}

TEST_F(WorldOfOne, SynchronizeThenStepReducesOnceAndUnusedParametersGetZeros) {
  auto used = torch::ones({3}).requires_grad_();
  auto unused = torch::ones({2}).requires_grad_();
  torch::optim::SGD sgd({used, unused}, torch::optim::SGDOptions(0.1));
  DistributedOptimizer opt(sgd, {{"used", used}, {"unused", unused}}, comm,
                           {.op = pushpull::collective::Reduction::kSum});
  (used * 2).sum().backward();
  opt.synchronize();
  ASSERT_TRUE(unused.grad().defined());
  EXPECT_TRUE(torch::equal(unused.grad(), torch::zeros({2})));
  opt.step();
  EXPECT_TRUE(torch::allclose(used.detach(), torch::full({3}, 0.8)));
  EXPECT_TRUE(torch::equal(unused.detach(), torch::ones({2})));
  const auto st = opt.stats();
  EXPECT_EQ(st.hook_allreduces, 1);
  EXPECT_EQ(st.sync_allreduces, 1);
}

TEST_F(WorldOfOne, AccumulatesBackwardPassesAndRefusesOneTooMany) {
  auto w = torch::ones({2}).requires_grad_();
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(1.0));
  DistributedOptimizer opt(sgd, {{"w", w}}, comm,
                           {.backward_passes_per_step = 2, .average_aggregated_gradients = true});
  (w * 1).sum().backward();
  EXPECT_EQ(opt.stats().hook_allreduces, 0);  // not yet: one pass of two
  (w * 3).sum().backward();
  EXPECT_EQ(opt.stats().hook_allreduces, 1);
  try {
    (w * 5).sum().backward();
    ADD_FAILURE() << "a third backward pass was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("backward_passes_per_step"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(opt.zero_grad(), InvalidArgument);  // the allreduce is still pending
  opt.step();
  // (1 + 3) / 2 = 2: the refused pass did not touch the gradient.
  EXPECT_TRUE(torch::allclose(w.detach(), torch::full({2}, -1.0)));
  opt.zero_grad();
}

TEST_F(WorldOfOne, ReducesFloat64AndStopsHookingWhenDestroyed) {
  auto w = torch::ones({4}, torch::kFloat64).requires_grad_();
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.5));
  {
    DistributedOptimizer opt(sgd, {{"w", w}}, comm);
    (w * 2).sum().backward();
    opt.step();
    EXPECT_EQ(opt.stats().hook_allreduces, 1);
  }
  EXPECT_TRUE(torch::allclose(w.detach(), torch::zeros({4}, torch::kFloat64)));
  // No hooks left: three backward passes in a row are plain libtorch again.
  for (int i = 0; i < 3; ++i)
    (w * 1).sum().backward();
  EXPECT_TRUE(torch::allclose(w.grad(), torch::full({4}, 5.0, torch::kFloat64)));
}

TEST_F(WorldOfOne, BroadcastsInAWorldOfOneAndChecksTheRoot) {
  auto model = make_model(1);
  const auto before = clone_all(model->parameters());
  broadcast_parameters(named(model->named_parameters()), 0, comm);
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(torch::equal(model->parameters()[i], before[i]));
  torch::optim::Adam adam(model->parameters());
  broadcast_optimizer_state(adam, 0, comm);
  auto throws = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no InvalidArgument mentioning '" << needle << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  throws([&] { broadcast_parameters(named(model->named_parameters()), 1, comm); }, "root_rank 1");
  throws([&] { broadcast_optimizer_state(adam, -1, comm); }, "root_rank -1");
  auto t = torch::ones({2});
  throws([&] { broadcast_parameters({{"a", t}, {"a", t}}, 0, comm); }, "appears twice");
  throws([&] { broadcast_parameters({{"b", torch::ones({2}, torch::kBool)}}, 0, comm); }, "dtype");
}

TEST_F(WorldOfOne, RejectsBadConstruction) {
  auto model = make_model(1);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  auto params = named(model->named_parameters());
  auto throws = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no InvalidArgument mentioning '" << needle << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto missing = params;
  missing.pop_back();
  throws([&] { DistributedOptimizer d(sgd, missing, comm); }, "not in named_parameters");
  auto twice = params;
  twice.push_back(params.front());
  throws([&] { DistributedOptimizer d(sgd, twice, comm); }, "appears twice");
  throws([&] { DistributedOptimizer d(sgd, params, comm, {.backward_passes_per_step = 0}); },
         "backward_passes_per_step");
  throws(
      [&] {
        DistributedOptimizer d(sgd, params, comm, {.op = pushpull::collective::Reduction::kMax});
      },
      "average or sum");
  throws([&] { DistributedOptimizer d(sgd, params, comm, {.process_set = {0, 0}}); }, "twice");
  throws([&] { DistributedOptimizer d(sgd, params, comm, {.process_set = {1}}); }, "outside 0..0");
  throws([&] { DistributedOptimizer d(sgd, params, comm, {.gradient_predivide_factor = 0}); },
         "gradient_predivide_factor");
  throws(
      [&] {
        DistributedOptimizer d(
            sgd, params, comm,
            {.op = pushpull::collective::Reduction::kSum, .gradient_predivide_factor = 2});
      },
      "only with op average");
  throws([&] { DistributedOptimizer d(sgd, params, comm, {.groups = {{"nope"}}}); },
         "not a parameter the optimizer reduces");
  const std::string first = params.front().first;
  throws(
      [&] {
        DistributedOptimizer d(sgd, params, comm, {.groups = {{first}, {first}}});
      },
      "two groups");
  throws([&] { DistributedOptimizer d(sgd, params, comm, {.num_groups = -1}); }, ">= 0");
  ASSERT_FALSE(pushpull::collective::is_initialized());
  throws([&] { DistributedOptimizer d(sgd, params); }, "collective::init()");
  throws([&] { broadcast_parameters(params, 0); }, "collective::init()");
}

}  // namespace
