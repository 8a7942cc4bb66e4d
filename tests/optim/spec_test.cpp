// SPDX-License-Identifier: Apache-2.0
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include "pushpull/error.h"
#include "pushpull/optimizer.h"

namespace pushpull {
namespace {

using ::testing::HasSubstr;

TEST(SpecTest, ParsesNameAndHyperparameters) {
  auto s = OptimizerSpec::parse(" sgd : learning_rate = 0.1, momentum=0.9 ");
  EXPECT_EQ(s.name, "sgd");
  ASSERT_EQ(s.hyperparameters.size(), 2u);
  EXPECT_EQ(s.hyperparameters.at("learning_rate"), 0.1);
  EXPECT_EQ(s.hyperparameters.at("momentum"), 0.9);
  EXPECT_TRUE(OptimizerSpec::parse("adam").hyperparameters.empty());
  EXPECT_TRUE(OptimizerSpec::parse("adam:").hyperparameters.empty());
  EXPECT_EQ(OptimizerSpec::parse("sgd:wd=-1e-3").hyperparameters.at("wd"), -1e-3);
}

TEST(SpecTest, ToStringRoundTripsEveryBit) {
  OptimizerSpec s{"adam",
                  {{"learning_rate", 1.0 / 3},
                   {"beta2", 0.999},
                   {"epsilon", 1e-8},
                   {"wd", std::numeric_limits<double>::denorm_min()},
                   {"rescale_grad", 123456789.123456789}}};
  std::string text = s.to_string();
  EXPECT_THAT(text, HasSubstr("adam:"));
  OptimizerSpec back = OptimizerSpec::parse(text);
  EXPECT_EQ(back, s);
  EXPECT_EQ(OptimizerSpec::parse("test").to_string(), "test");
}

TEST(SpecTest, MalformedTextIsInvalidArgument) {
  for (const char* bad :
       {"", ":lr=1", "sgd:learning_rate", "sgd:learning_rate=", "sgd:learning_rate=abc",
        "sgd:learning_rate=1x", "sg d", "sgd:momentum=0.1,momentum=0.2", "sgd:=3", "sgd:lr=1,,"}) {
    EXPECT_THROW(OptimizerSpec::parse(bad), InvalidArgument) << bad;
  }
}

TEST(SpecTest, KnowsTheSixOptimizers) {
  EXPECT_THAT(optimizer_names(),
              ::testing::UnorderedElementsAre("sgd", "nag", "adam", "adagrad", "rmsprop", "test"));
  for (const auto& name : optimizer_names()) {
    auto opt = create_optimizer({name, {}});
    EXPECT_EQ(opt->name(), name);
    EXPECT_EQ(opt->hyperparameter("rescale_grad"), 1.0);
    EXPECT_EQ(opt->hyperparameter("clip_gradient"), -1.0);
  }
}

TEST(SpecTest, DefaultsAreMXNets) {
  EXPECT_EQ(create_optimizer({"sgd", {}})->hyperparameter("learning_rate"), 0.01);
  auto adam = create_optimizer({"adam", {{"beta1", 0.8}}});
  EXPECT_EQ(adam->hyperparameter("learning_rate"), 0.001);
  EXPECT_EQ(adam->hyperparameter("beta1"), 0.8);
  EXPECT_EQ(adam->hyperparameter("beta2"), 0.999);
  EXPECT_EQ(adam->hyperparameter("epsilon"), 1e-8);
  EXPECT_EQ(create_optimizer({"adagrad", {}})->hyperparameter("epsilon"), 1e-7);
  EXPECT_EQ(create_optimizer({"rmsprop", {}})->hyperparameter("gamma1"), 0.9);
}

TEST(SpecTest, UnknownNameListsValidOnes) {
  try {
    create_optimizer({"adamw", {}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("adamw"));
    EXPECT_THAT(e.what(), HasSubstr("sgd"));
    EXPECT_THAT(e.what(), HasSubstr("rmsprop"));
  }
}

TEST(SpecTest, UnknownHyperparameterListsValidOnes) {
  try {
    create_optimizer(OptimizerSpec::parse("sgd:beta1=0.9"));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("beta1"));
    EXPECT_THAT(e.what(), HasSubstr("momentum"));
    EXPECT_THAT(e.what(), HasSubstr("learning_rate"));
  }
}

TEST(SpecTest, OutOfRangeValuesAreRejected) {
  for (const char* bad : {"adam:beta1=1", "adam:beta2=-0.1", "adam:epsilon=0", "sgd:momentum=1.5",
                          "sgd:learning_rate=-1", "sgd:multi_precision=2", "rmsprop:centered=0.5",
                          "sgd:learning_rate=nan", "sgd:rescale_grad=inf"}) {
    EXPECT_THROW(create_optimizer(OptimizerSpec::parse(bad)), InvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace pushpull
