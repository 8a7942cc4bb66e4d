// SPDX-License-Identifier: Apache-2.0
#include "pushpull/optimizer.h"

#include <array>

#include <fmt/format.h>

#include "pushpull/error.h"
#include "pushpull/kernels.h"

namespace pushpull {

Optimizer::Optimizer(OptimizerSpec full_spec)
    : spec_(std::move(full_spec)), multi_precision_(hyperparameter("multi_precision") != 0) {}

Optimizer::~Optimizer() = default;

double Optimizer::hyperparameter(std::string_view name) const {
  auto it = spec_.hyperparameters.find(std::string(name));
  if (it == spec_.hyperparameters.end())
    throw InvalidArgument(fmt::format("optimizer {} has no hyperparameter '{}' (it has: {})",
                                      spec_.name, name, spec_.to_string()));
  return it->second;
}

Optimizer::KeyState& Optimizer::state_for(const Key& key) {
  std::lock_guard lock(mu_);
  auto& slot = states_[key];
  if (!slot) slot = std::make_unique<KeyState>();
  return *slot;
}

int64_t Optimizer::update_count(const Key& key) const {
  std::lock_guard lock(mu_);
  auto it = states_.find(key);
  return it == states_.end() ? 0 : it->second->count;
}

size_t Optimizer::num_keys() const {
  std::lock_guard lock(mu_);
  return states_.size();
}

void Optimizer::clear_states() {
  std::lock_guard lock(mu_);
  states_.clear();
}

namespace {

void ensure_f32(Array& a, const Shape& shape) {
  if (a.empty() || !(a.shape() == shape)) a = Array(shape, DType::kFloat32);
}

}  // namespace

void Optimizer::update(const Key& key, const ArrayView& weight, const ArrayView& grad) {
  update(key, weight, grad, weight);
}

void Optimizer::update(const Key& key, const ArrayView& weight, const ArrayView& grad,
                       const ArrayView& out) {
  auto where = [&] { return fmt::format("optimizer {} on key {}", spec_.name, key.to_string()); };
  if (out.dtype != weight.dtype || !(out.shape == weight.shape) || !out.device.is_cpu())
    throw InvalidArgument(fmt::format("{}: output {} does not match weight {}", where(),
                                      out.describe(), weight.describe()));
  if (!weight.device.is_cpu() || !grad.device.is_cpu())
    throw InvalidArgument(
        fmt::format("{}: arrays on {} are not supported yet (CPU only)", where(),
                    weight.device.is_cpu() ? grad.device.to_string() : weight.device.to_string()));
  if (!is_floating(weight.dtype))
    throw InvalidArgument(
        fmt::format("{}: weight is {}; optimizers need float32, float64, float16 or bfloat16",
                    where(), weight.describe()));
  const bool half = is_half(weight.dtype);
  if (grad.dtype != weight.dtype && !(half && grad.dtype == DType::kFloat32))
    throw InvalidArgument(fmt::format("{}: gradient {} does not match weight {}", where(),
                                      grad.describe(), weight.describe()));
  if (!(grad.shape == weight.shape))
    throw InvalidArgument(fmt::format("{}: gradient shape {} differs from weight shape {}", where(),
                                      grad.shape.to_string(), weight.shape.to_string()));
  const size_t n = static_cast<size_t>(weight.numel());
  if (n > 0 && (!weight.data || !grad.data || !out.data))
    throw InvalidArgument(
        fmt::format("{}: weight or gradient has no data (null pointer)", where()));

  const bool f64 = weight.dtype == DType::kFloat64;
  const bool master = half && multi_precision_;
  const DType sdt = f64 ? DType::kFloat64 : DType::kFloat32;
  const size_t nstates = static_cast<size_t>(num_rule_states()) + (master ? 1 : 0);
  KeyState& st = state_for(key);
  if (st.count == 0 && st.arrays.empty()) {
    for (int i = 0; i < num_rule_states(); ++i)
      st.arrays.emplace_back(weight.shape, sdt);
    if (master) {
      Array m(weight.shape, DType::kFloat32);
      convert(DType::kFloat32, m.data(), weight.dtype, weight.data, n);
      st.arrays.push_back(std::move(m));
    }
  }
  if (st.arrays.size() != nstates)
    throw InvalidArgument(fmt::format(
        "{}: the key has {} state arrays but this weight ({}) needs {}; were the states loaded "
        "from another configuration?",
        where(), st.arrays.size(), weight.describe(), nstates));
  for (const Array& a : st.arrays)
    if (a.dtype() != sdt || static_cast<size_t>(a.numel()) != n)
      throw InvalidArgument(fmt::format(
          "{}: state {} does not fit weight {}; were the states loaded for another model?", where(),
          a.view().describe(), weight.describe()));
  if (nstates > 8) throw Internal("optimizer keeps more than 8 state arrays");

  const int64_t t = ++st.count;
  if (f64) {
    std::array<double*, 8> s{};
    for (size_t i = 0; i < nstates; ++i)
      s[i] = st.arrays[i].as<double>();
    step(out.as<double>(), weight.as<const double>(), grad.as<const double>(), s.data(), n, t);
    return;
  }
  std::array<float*, 8> s{};
  for (size_t i = 0; i < nstates; ++i)
    s[i] = st.arrays[i].as<float>();
  if (!half) {
    step(out.as<float>(), weight.as<const float>(), grad.as<const float>(), s.data(), n, t);
    return;
  }
  // 16-bit weights: compute in float32, round once when writing back.
  float* w32;
  if (master) {
    w32 = s[nstates - 1];
  } else {
    ensure_f32(st.scratch_w, weight.shape);
    w32 = st.scratch_w.as<float>();
    convert(DType::kFloat32, w32, weight.dtype, weight.data, n);
  }
  const float* g32;
  if (grad.dtype == DType::kFloat32) {
    g32 = grad.as<const float>();
  } else {
    ensure_f32(st.scratch_g, weight.shape);
    convert(DType::kFloat32, st.scratch_g.data(), grad.dtype, grad.data, n);
    g32 = st.scratch_g.as<const float>();
  }
  step(w32, w32, g32, s.data(), n, t);
  convert(out.dtype, out.data, DType::kFloat32, w32, n);
}

}  // namespace pushpull
