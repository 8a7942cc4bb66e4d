// SPDX-License-Identifier: Apache-2.0
// Each optimizer against a double-precision reference written from MXNet's
// documented formulas, for several steps with fresh random gradients.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/optimizer.h"

namespace pushpull {
namespace {

using Vec = std::vector<double>;

double clipd(double g, double c) {
  return c >= 0 ? std::max(-c, std::min(c, g)) : g;
}

// One reference step of `name` on element i. `s` holds the element's states.
struct Ref {
  std::map<std::string, double> hp;
  double h(const char* k) const { return hp.at(k); }

  void step(const std::string& name, double& w, double g, std::vector<double>& s, int t) const {
    const double lr = h("learning_rate"), wd = h("wd"), rs = h("rescale_grad"),
                 cg = h("clip_gradient");
    if (name == "test") {
      w = w + rs * g;
    } else if (name == "sgd") {
      double gr = clipd(rs * g, cg);
      if (h("momentum") == 0) {
        w = w - lr * (gr + wd * w);
      } else {
        s[0] = h("momentum") * s[0] - lr * (gr + wd * w);
        w = w + s[0];
      }
    } else if (name == "nag") {
      double gr = clipd(rs * g, cg) + wd * w;
      if (h("momentum") == 0) {
        w = w - lr * gr;
      } else {
        s[0] = h("momentum") * s[0] + gr;
        w = w - lr * (gr + h("momentum") * s[0]);
      }
    } else if (name == "adam") {
      double gr = clipd(rs * g + wd * w, cg);
      s[0] = h("beta1") * s[0] + (1 - h("beta1")) * gr;
      s[1] = h("beta2") * s[1] + (1 - h("beta2")) * gr * gr;
      double mhat = s[0] / (1 - std::pow(h("beta1"), t));
      double vhat = s[1] / (1 - std::pow(h("beta2"), t));
      // MXNet folds the correction into lr: eps is scaled by sqrt(1-b2^t).
      w = w - lr * mhat / (std::sqrt(vhat) + h("epsilon") / std::sqrt(1 - std::pow(h("beta2"), t)));
    } else if (name == "adagrad") {
      double gr = clipd(rs * g, cg);
      s[0] += gr * gr;
      w = w - lr * (gr / std::sqrt(s[0] + h("epsilon")) + wd * w);
    } else if (name == "rmsprop") {
      double gr = clipd(rs * g + wd * w, cg);
      const double g1 = h("gamma1");
      s[0] = (1 - g1) * gr * gr + g1 * s[0];
      if (h("centered") != 0) {
        s[1] = (1 - g1) * gr + g1 * s[1];
        s[2] = h("gamma2") * s[2] - lr * gr / std::sqrt(s[0] - s[1] * s[1] + h("epsilon"));
        w = w + s[2];
      } else {
        w = w - lr * gr / std::sqrt(s[0] + h("epsilon"));
      }
      w = clipd(w, h("clip_weights"));
    } else {
      ADD_FAILURE() << "no reference for " << name;
    }
  }
};

struct Case {
  const char* spec;
};

class OptimizerRefTest : public ::testing::TestWithParam<const char*> {};

template <typename T>
void run_against_reference(const char* text, double tol) {
  const int n = 37, steps = 6;
  auto opt = create_optimizer(OptimizerSpec::parse(text));
  Ref ref{opt->spec().hyperparameters};
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> w(n), g(n);
  Vec wr(n);
  std::vector<std::vector<double>> sr(n, std::vector<double>(3, 0.0));
  for (int i = 0; i < n; ++i)
    wr[i] = w[i] = static_cast<T>(u(rng));
  for (int t = 1; t <= steps; ++t) {
    for (int i = 0; i < n; ++i)
      g[i] = static_cast<T>(2 * u(rng));
    opt->update(Key(3), ArrayView(w.data(), {n}), ArrayView(g.data(), {n}));
    for (int i = 0; i < n; ++i) {
      ref.step(opt->name(), wr[i], static_cast<double>(g[i]), sr[i], t);
      ASSERT_NEAR(w[i], wr[i], tol * (1 + std::abs(wr[i]))) << text << " step " << t << " i " << i;
    }
  }
  EXPECT_EQ(opt->update_count(Key(3)), steps);
}

TEST_P(OptimizerRefTest, Float32MatchesReference) {
  run_against_reference<float>(GetParam(), 2e-5);
}

TEST_P(OptimizerRefTest, Float64MatchesReference) {
  run_against_reference<double>(GetParam(), 1e-12);
}

// Three optimizers of one spec take the same steps: in place, into the
// gradient's buffer, and into a separate array (the parameter server's
// update when a backup still holds the weight). Every result is bit for bit
// the in-place one, and the weight read out of place is left unchanged.
template <typename T>
void out_of_place_matches_in_place(const char* text) {
  const int n = 37, steps = 6;
  auto in_place = create_optimizer(OptimizerSpec::parse(text));
  auto into_grad = create_optimizer(OptimizerSpec::parse(text));
  auto into_other = create_optimizer(OptimizerSpec::parse(text));
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> w(n);
  for (auto& x : w)
    x = static_cast<T>(u(rng));
  std::vector<T> w_grad = w, w_other = w;
  for (int t = 1; t <= steps; ++t) {
    std::vector<T> g(n);
    for (auto& x : g)
      x = static_cast<T>(2 * u(rng));
    std::vector<T> g_in = g, out(n);
    in_place->update(Key(3), ArrayView(w.data(), {n}), ArrayView(g_in.data(), {n}));
    const std::vector<T> before = w_grad;
    into_grad->update(Key(3), ArrayView(w_grad.data(), {n}), ArrayView(g.data(), {n}),
                      ArrayView(g.data(), {n}));
    EXPECT_EQ(w_grad, before) << text << ": the weight read out of place changed";
    // Not `w_grad = g`: that trips g++ 12's -Wstringop-overflow (a false positive).
    std::copy(g.begin(), g.end(), w_grad.begin());
    std::vector<T> g2 = g_in;
    into_other->update(Key(3), ArrayView(w_other.data(), {n}), ArrayView(g2.data(), {n}),
                       ArrayView(out.data(), {n}));
    w_other = out;
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(&w[i], &w_grad[i], sizeof(T)), 0)
          << text << " step " << t << " i " << i;
      ASSERT_EQ(std::memcmp(&w[i], &w_other[i], sizeof(T)), 0)
          << text << " step " << t << " i " << i;
    }
  }
}

TEST_P(OptimizerRefTest, OutOfPlaceIsBitForBitInPlace) {
  out_of_place_matches_in_place<float>(GetParam());
  out_of_place_matches_in_place<double>(GetParam());
}

TEST(OptimizerTest, AnOutputOfAnotherShapeOrDtypeIsRefused) {
  auto opt = create_optimizer(OptimizerSpec::parse("sgd"));
  float w[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1}, small[2] = {};
  double wide[4] = {};
  EXPECT_THROW(opt->update(0, ArrayView(w, {4}), ArrayView(g, {4}), ArrayView(small, {2})),
               InvalidArgument);
  EXPECT_THROW(opt->update(0, ArrayView(w, {4}), ArrayView(g, {4}), ArrayView(wide, {4})),
               InvalidArgument);
  EXPECT_EQ(opt->update_count(0), 0);
  EXPECT_EQ(w[0], 1.0f);
}

INSTANTIATE_TEST_SUITE_P(
    All, OptimizerRefTest,
    ::testing::Values("test:rescale_grad=0.5", "sgd:learning_rate=0.1",
                      "sgd:learning_rate=0.1,wd=0.01,rescale_grad=0.5,clip_gradient=0.3",
                      "sgd:learning_rate=0.1,momentum=0.9,wd=0.001",
                      "sgd:learning_rate=0.05,momentum=0.5,clip_gradient=0.2",
                      "nag:learning_rate=0.1", "nag:learning_rate=0.1,momentum=0.9,wd=0.01", "adam",
                      "adam:learning_rate=0.01,beta1=0.8,wd=0.01,clip_gradient=0.5",
                      "adagrad:learning_rate=0.1",
                      "adagrad:learning_rate=0.1,wd=0.1,rescale_grad=2",
                      "rmsprop:learning_rate=0.01", "rmsprop:learning_rate=0.01,wd=0.01",
                      "rmsprop:learning_rate=0.01,centered=1,clip_weights=0.5,gamma2=0.8"));

TEST(OptimizerTest, StatesArePerKey) {
  auto opt = create_optimizer(OptimizerSpec::parse("sgd:learning_rate=1,momentum=0.5"));
  float a = 0, b = 0, g = 1;
  opt->update("a", ArrayView(&a, {1}), ArrayView(&g, {1}));  // mom=-1, a=-1
  opt->update("a", ArrayView(&a, {1}), ArrayView(&g, {1}));  // mom=-1.5, a=-2.5
  opt->update("b", ArrayView(&b, {1}), ArrayView(&g, {1}));  // fresh momentum: b=-1
  EXPECT_FLOAT_EQ(a, -2.5f);
  EXPECT_FLOAT_EQ(b, -1.0f);
  EXPECT_EQ(opt->update_count("a"), 2);
  EXPECT_EQ(opt->update_count("b"), 1);
  EXPECT_EQ(opt->num_keys(), 2u);
  opt->clear_states();
  EXPECT_EQ(opt->num_keys(), 0u);
}

// Reference for 16-bit weights without a master copy: the weight is rounded
// to 16 bits after every step, the state stays float32.
template <uint16_t (*ToHalf)(float), float (*FromHalf)(uint16_t)>
void check_half(DType dt, const char* text, bool f32_grad) {
  const int n = 16;
  auto opt = create_optimizer(OptimizerSpec::parse(text));
  Ref ref{opt->spec().hyperparameters};
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<uint16_t> w(n), g(n);
  std::vector<float> g32(n);
  Vec wr(n);
  std::vector<Vec> sr(n, Vec(3, 0.0));
  for (int i = 0; i < n; ++i) {
    w[i] = ToHalf(static_cast<float>(u(rng)));
    wr[i] = FromHalf(w[i]);
  }
  for (int t = 1; t <= 4; ++t) {
    for (int i = 0; i < n; ++i) {
      g[i] = ToHalf(static_cast<float>(u(rng)));
      g32[i] = static_cast<float>(u(rng));
    }
    ArrayView grad = f32_grad ? ArrayView(g32.data(), {n}) : ArrayView(g.data(), dt, {n});
    opt->update(Key(0), ArrayView(w.data(), dt, {n}), grad);
    for (int i = 0; i < n; ++i) {
      double gi = f32_grad ? g32[i] : FromHalf(g[i]);
      ref.step(opt->name(), wr[i], gi, sr[i], t);
      wr[i] = FromHalf(ToHalf(static_cast<float>(wr[i])));
      // At most one 16-bit rounding step apart.
      double ulp = dt == DType::kFloat16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
      ASSERT_NEAR(FromHalf(w[i]), wr[i], 1.01 * ulp * std::max(1.0, std::abs(wr[i])))
          << text << " step " << t;
    }
  }
}

TEST(OptimizerTest, Float16WeightsUpdateInFloat32) {
  for (bool f32_grad : {false, true}) {
    check_half<float_to_half, half_to_float>(DType::kFloat16, "sgd:learning_rate=0.1,momentum=0.9",
                                             f32_grad);
    check_half<float_to_half, half_to_float>(DType::kFloat16, "adam:learning_rate=0.01", f32_grad);
  }
}

TEST(OptimizerTest, Float16WeightsUpdateOutOfPlaceAsInPlace) {
  for (const char* text : {"sgd:learning_rate=0.1,momentum=0.9", "adam:learning_rate=0.01",
                           "sgd:learning_rate=0.1,multi_precision=1"}) {
    auto in_place = create_optimizer(OptimizerSpec::parse(text));
    auto out_of_place = create_optimizer(OptimizerSpec::parse(text));
    std::vector<uint16_t> w(8), w2(8), out(8);
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = w2[i] = float_to_half(0.25f * static_cast<float>(i) - 1.0f);
    std::vector<float> g(8, 0.5f);
    for (int t = 0; t < 3; ++t) {
      const std::vector<uint16_t> before = w2;
      in_place->update(0, ArrayView(w.data(), DType::kFloat16, {8}), ArrayView(g.data(), {8}));
      out_of_place->update(0, ArrayView(w2.data(), DType::kFloat16, {8}), ArrayView(g.data(), {8}),
                           ArrayView(out.data(), DType::kFloat16, {8}));
      EXPECT_EQ(w2, before) << text;
      EXPECT_EQ(out, w) << text << " step " << t;
      w2 = out;
    }
  }
}

TEST(OptimizerTest, BFloat16WeightsUpdateInFloat32) {
  for (bool f32_grad : {false, true}) {
    check_half<float_to_bfloat16, bfloat16_to_float>(DType::kBFloat16,
                                                     "sgd:learning_rate=0.1,wd=0.01", f32_grad);
    check_half<float_to_bfloat16, bfloat16_to_float>(DType::kBFloat16, "rmsprop:learning_rate=0.01",
                                                     f32_grad);
  }
}

TEST(OptimizerTest, MultiPrecisionAccumulatesSmallSteps) {
  // lr * grad = 1e-4 is below half the float16 spacing near 1 (2.4e-4), so
  // without a master copy every step rounds back to 1.
  auto plain = create_optimizer(OptimizerSpec::parse("sgd:learning_rate=0.0001"));
  auto mp = create_optimizer(OptimizerSpec::parse("sgd:learning_rate=0.0001,multi_precision=1"));
  uint16_t wp = float_to_half(1.0f), wm = float_to_half(1.0f);
  uint16_t g = float_to_half(1.0f);
  for (int i = 0; i < 20; ++i) {
    plain->update(1, ArrayView(&wp, DType::kFloat16, {1}), ArrayView(&g, DType::kFloat16, {1}));
    mp->update(1, ArrayView(&wm, DType::kFloat16, {1}), ArrayView(&g, DType::kFloat16, {1}));
  }
  EXPECT_EQ(half_to_float(wp), 1.0f);
  EXPECT_NEAR(half_to_float(wm), 1.0 - 20 * 1e-4, 3e-4);
  EXPECT_LT(half_to_float(wm), 1.0f);
}

TEST(OptimizerTest, BadArraysAreRejectedWithoutTouchingState) {
  auto opt = create_optimizer(OptimizerSpec::parse("adam"));
  float w[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1};
  double gd[4] = {1, 1, 1, 1};
  int32_t wi[4] = {1, 2, 3, 4};
  uint16_t wh[4] = {};
  EXPECT_THROW(opt->update(0, ArrayView(wi, {4}), ArrayView(wi, {4})), InvalidArgument);
  EXPECT_THROW(opt->update(0, ArrayView(w, {4}), ArrayView(gd, {4})), InvalidArgument);
  EXPECT_THROW(opt->update(0, ArrayView(w, {4}), ArrayView(g, {2, 2})), InvalidArgument);
  EXPECT_THROW(opt->update(0, ArrayView(w, {4}), ArrayView(static_cast<float*>(nullptr), {4})),
               InvalidArgument);
  EXPECT_THROW(opt->update(0, ArrayView(w, {4}, Device::cuda(0)), ArrayView(g, {4})),
               InvalidArgument);
  EXPECT_THROW(opt->update(0, ArrayView(wh, DType::kFloat16, {4}), ArrayView(gd, {4})),
               InvalidArgument);
  EXPECT_EQ(opt->update_count(0), 0);
  EXPECT_EQ(w[0], 1.0f);
  // A key whose first weight was float32 cannot later take a float64 weight.
  opt->update(0, ArrayView(w, {4}), ArrayView(g, {4}));
  EXPECT_THROW(opt->update(0, ArrayView(gd, {4}), ArrayView(gd, {4})), InvalidArgument);
  EXPECT_EQ(opt->update_count(0), 1);
}

TEST(OptimizerTest, StringAndIntKeysAreDistinct) {
  auto opt = create_optimizer(OptimizerSpec::parse("test"));
  float w = 0, g = 2;
  opt->update("1", ArrayView(&w, {1}), ArrayView(&g, {1}));
  EXPECT_EQ(opt->update_count("1"), 1);
  EXPECT_EQ(opt->update_count(1), 0);
  EXPECT_EQ(w, 2.0f);
}

}  // namespace
}  // namespace pushpull
