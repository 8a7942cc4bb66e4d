// SPDX-License-Identifier: Apache-2.0
// The update rules, written after MXNet 1.x (python/mxnet/optimizer.py and the
// sgd/adam/rmsprop operators in src/operator/optimizer_op-inl.h), and
// create_optimizer with each rule's hyperparameters and their defaults.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pushpull/error.h"
#include "pushpull/optimizer.h"

namespace pushpull {
namespace {

// clip_gradient < 0 means "no clipping", as MXNet's None.
template <typename T>
inline T clip(T g, T c) {
  return c >= 0 ? std::clamp(g, -c, c) : g;
}

// Hyperparameters every rule takes, read once at construction.
struct Common {
  explicit Common(const OptimizerSpec& s)
      : lr(s.hyperparameters.at("learning_rate")),
        wd(s.hyperparameters.at("wd")),
        rescale(s.hyperparameters.at("rescale_grad")),
        clip_gradient(s.hyperparameters.at("clip_gradient")) {}
  double lr, wd, rescale, clip_gradient;
};

// Implements both step() overloads with one template `run<T>`. A rule reads
// w[i] and g[i] before it writes out[i], and nothing else at i: `out` may be
// `w` (in place) or `g` (the update lands in the gradient's buffer).
template <typename Derived>
class Rule : public Optimizer {
 public:
  explicit Rule(OptimizerSpec s) : Optimizer(std::move(s)), c(spec()) {}

 protected:
  void step(float* out, const float* w, const float* g, float* const* s, size_t n,
            int64_t t) override {
    dispatch<float>(out, w, g, s, n, t);
  }
  void step(double* out, const double* w, const double* g, double* const* s, size_t n,
            int64_t t) override {
    dispatch<double>(out, w, g, s, n, t);
  }
  // In place, the rule is inlined with one pointer for `out` and `w`, so the
  // loop the compiler vectorises is the two-array one it was before `out`
  // existed, with no alias check against a third array.
  template <typename T>
  void dispatch(T* out, const T* w, const T* g, T* const* s, size_t n, int64_t t) {
    auto* rule = static_cast<Derived*>(this);
    if (out == w)
      rule->template run<T>(out, out, g, s, n, t);
    else
      rule->template run<T>(out, w, g, s, n, t);
  }
  double hp(const char* name) const { return spec().hyperparameters.at(name); }
  Common c;
};

class Sgd : public Rule<Sgd> {
 public:
  explicit Sgd(OptimizerSpec s) : Rule(std::move(s)), momentum_(hp("momentum")) {}
  int num_rule_states() const override { return momentum_ != 0 ? 1 : 0; }
  template <typename T>
  void run(T* out, const T* w, const T* g, T* const* s, size_t n, int64_t) {
    const T lr = c.lr, wd = c.wd, rs = c.rescale, cl = c.clip_gradient, mom = momentum_;
    if (momentum_ == 0) {
      for (size_t i = 0; i < n; ++i)
        out[i] = (T(1) - lr * wd) * w[i] - lr * clip(rs * g[i], cl);
      return;
    }
    T* m = s[0];
    for (size_t i = 0; i < n; ++i) {
      const T wi = w[i];
      m[i] = mom * m[i] - lr * wd * wi - lr * clip(rs * g[i], cl);
      out[i] = wi + m[i];
    }
  }

 private:
  double momentum_;
};

class Nag : public Rule<Nag> {
 public:
  explicit Nag(OptimizerSpec s) : Rule(std::move(s)), momentum_(hp("momentum")) {}
  int num_rule_states() const override { return momentum_ != 0 ? 1 : 0; }
  template <typename T>
  void run(T* out, const T* w, const T* g, T* const* s, size_t n, int64_t) {
    const T lr = c.lr, wd = c.wd, rs = c.rescale, cl = c.clip_gradient, mom = momentum_;
    if (momentum_ == 0) {
      for (size_t i = 0; i < n; ++i) {
        const T wi = w[i];
        out[i] = wi - lr * (clip(rs * g[i], cl) + wd * wi);
      }
      return;
    }
    T* m = s[0];
    for (size_t i = 0; i < n; ++i) {
      const T wi = w[i];
      T grad = clip(rs * g[i], cl) + wd * wi;
      m[i] = mom * m[i] + grad;
      out[i] = wi - lr * (grad + mom * m[i]);
    }
  }

 private:
  double momentum_;
};

class Adam : public Rule<Adam> {
 public:
  explicit Adam(OptimizerSpec s)
      : Rule(std::move(s)), b1_(hp("beta1")), b2_(hp("beta2")), eps_(hp("epsilon")) {}
  int num_rule_states() const override { return 2; }
  template <typename T>
  void run(T* out, const T* w, const T* g, T* const* s, size_t n, int64_t t) {
    // Bias correction folded into the step size, as MXNet does.
    const double coef1 = 1 - std::pow(b1_, static_cast<double>(t));
    const double coef2 = 1 - std::pow(b2_, static_cast<double>(t));
    const T lr = c.lr * std::sqrt(coef2) / coef1;
    const T wd = c.wd, rs = c.rescale, cl = c.clip_gradient, b1 = b1_, b2 = b2_, eps = eps_;
    T* mean = s[0];
    T* var = s[1];
    for (size_t i = 0; i < n; ++i) {
      const T wi = w[i];
      T grad = clip(rs * g[i] + wd * wi, cl);
      mean[i] = b1 * mean[i] + (T(1) - b1) * grad;
      var[i] = b2 * var[i] + (T(1) - b2) * grad * grad;
      out[i] = wi - lr * mean[i] / (std::sqrt(var[i]) + eps);
    }
  }

 private:
  double b1_, b2_, eps_;
};

class AdaGrad : public Rule<AdaGrad> {
 public:
  explicit AdaGrad(OptimizerSpec s) : Rule(std::move(s)), eps_(hp("epsilon")) {}
  int num_rule_states() const override { return 1; }
  template <typename T>
  void run(T* out, const T* w, const T* g, T* const* s, size_t n, int64_t) {
    const T lr = c.lr, wd = c.wd, rs = c.rescale, cl = c.clip_gradient, eps = eps_;
    T* hist = s[0];
    for (size_t i = 0; i < n; ++i) {
      const T wi = w[i];
      T grad = clip(rs * g[i], cl);
      hist[i] += grad * grad;
      out[i] = wi - lr * (grad / std::sqrt(hist[i] + eps) + wd * wi);
    }
  }

 private:
  double eps_;
};

class RmsProp : public Rule<RmsProp> {
 public:
  explicit RmsProp(OptimizerSpec s)
      : Rule(std::move(s)),
        g1_(hp("gamma1")),
        g2_(hp("gamma2")),
        eps_(hp("epsilon")),
        centered_(hp("centered") != 0),
        clip_weights_(hp("clip_weights")) {}
  int num_rule_states() const override { return centered_ ? 3 : 1; }
  template <typename T>
  void run(T* out, const T* w, const T* g, T* const* s, size_t n, int64_t) {
    const T lr = c.lr, wd = c.wd, rs = c.rescale, cl = c.clip_gradient, g1 = g1_, g2 = g2_,
            eps = eps_, cw = clip_weights_;
    T* sn = s[0];
    for (size_t i = 0; i < n; ++i) {
      T wi = w[i];
      T grad = clip(rs * g[i] + wd * wi, cl);
      sn[i] = (T(1) - g1) * grad * grad + g1 * sn[i];
      if (centered_) {
        T* sg = s[1];
        T* delta = s[2];
        sg[i] = (T(1) - g1) * grad + g1 * sg[i];
        delta[i] = g2 * delta[i] - lr * grad / std::sqrt(sn[i] - sg[i] * sg[i] + eps);
        wi += delta[i];
      } else {
        wi -= lr * grad / std::sqrt(sn[i] + eps);
      }
      out[i] = clip(wi, cw);
    }
  }

 private:
  double g1_, g2_, eps_;
  bool centered_;
  double clip_weights_;
};

// MXNet's "test" optimizer: weight += rescale_grad * grad.
class TestRule : public Rule<TestRule> {
 public:
  using Rule::Rule;
  int num_rule_states() const override { return 0; }
  template <typename T>
  void run(T* out, const T* w, const T* g, T* const*, size_t n, int64_t) {
    const T rs = c.rescale;
    for (size_t i = 0; i < n; ++i)
      out[i] = w[i] + rs * g[i];
  }
};

using Factory = std::function<std::unique_ptr<Optimizer>(OptimizerSpec)>;
struct RuleInfo {
  const char* name;
  double learning_rate;
  std::vector<std::pair<const char*, double>> extra;
  Factory make;
};

template <typename R>
Factory factory() {
  return [](OptimizerSpec s) { return std::make_unique<R>(std::move(s)); };
}

std::vector<RuleInfo> rules() {
  return {
      {"adagrad", 0.01, {{"epsilon", 1e-7}}, factory<AdaGrad>()},
      {"adam", 0.001, {{"beta1", 0.9}, {"beta2", 0.999}, {"epsilon", 1e-8}}, factory<Adam>()},
      {"nag", 0.01, {{"momentum", 0.0}}, factory<Nag>()},
      {"rmsprop",
       0.001,
       {{"gamma1", 0.9}, {"gamma2", 0.9}, {"epsilon", 1e-8}, {"centered", 0}, {"clip_weights", -1}},
       factory<RmsProp>()},
      {"sgd", 0.01, {{"momentum", 0.0}}, factory<Sgd>()},
      {"test", 0.01, {}, factory<TestRule>()},
  };
}

// Range checks by hyperparameter name; returns what is wrong, or "".
std::string check_value(const std::string& name, double v) {
  if (std::isnan(v)) return "is NaN";
  auto in01 = [&](bool upper_open) {
    return v >= 0 && (upper_open ? v < 1 : v <= 1)
               ? ""
               : "must be in [0, 1" + std::string(upper_open ? ")" : "]");
  };
  if (name == "beta1" || name == "beta2" || name == "momentum") return in01(true);
  if (name == "gamma1" || name == "gamma2") return in01(false);
  if (name == "epsilon") return v > 0 && std::isfinite(v) ? "" : "must be positive";
  if (name == "learning_rate" || name == "wd")
    return v >= 0 && std::isfinite(v) ? "" : "must be finite and not negative";
  if (name == "multi_precision" || name == "centered")
    return v == 0 || v == 1 ? "" : "must be 0 or 1";
  if (!std::isfinite(v)) return "must be finite";
  return "";
}

}  // namespace

std::vector<std::string> optimizer_names() {
  std::vector<std::string> names;
  for (const auto& r : rules())
    names.emplace_back(r.name);
  return names;
}

std::unique_ptr<Optimizer> create_optimizer(const OptimizerSpec& spec) {
  for (auto& r : rules()) {
    if (spec.name != r.name) continue;
    OptimizerSpec full{spec.name,
                       {{"learning_rate", r.learning_rate},
                        {"wd", 0.0},
                        {"rescale_grad", 1.0},
                        {"clip_gradient", -1.0},
                        {"multi_precision", 0.0}}};
    for (auto& [k, v] : r.extra)
      full.hyperparameters[k] = v;
    for (const auto& [k, v] : spec.hyperparameters) {
      auto it = full.hyperparameters.find(k);
      if (it == full.hyperparameters.end()) {
        std::vector<std::string> valid;
        for (auto& kv : full.hyperparameters)
          valid.push_back(kv.first);
        throw InvalidArgument(fmt::format("optimizer {} has no hyperparameter '{}'; valid: {}",
                                          spec.name, k, fmt::join(valid, ", ")));
      }
      if (auto what = check_value(k, v); !what.empty())
        throw InvalidArgument(fmt::format("optimizer {}: {}={} {}", spec.name, k, v, what));
      it->second = v;
    }
    return r.make(std::move(full));
  }
  throw InvalidArgument(fmt::format("unknown optimizer '{}'; valid: {}", spec.name,
                                    fmt::join(optimizer_names(), ", ")));
}

}  // namespace pushpull
