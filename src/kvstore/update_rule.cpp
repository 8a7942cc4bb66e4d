// SPDX-License-Identifier: Apache-2.0
#include "kvstore/update_rule.h"

#include <fmt/format.h>

#include "pushpull/error.h"
#include "pushpull/kernels.h"

namespace pushpull::kv {

void apply_update(const UpdateRule* rule, const Key& key, const ArrayView& summed,
                  const ArrayView& stored, Array& rounded) {
  const size_t n = static_cast<size_t>(stored.numel());
  if (rule && rule->optimizer) {
    rule->optimizer->update(key, stored, summed);
    return;
  }
  if (!rule || !rule->updater) {
    if (n) convert(stored.dtype, stored.data, summed.dtype, summed.data, n);
    return;
  }
  if (summed.dtype == stored.dtype) {
    rule->updater(key, summed, stored);
    return;
  }
  // 16-bit values: the updater sees the sum rounded once to the key's dtype.
  if (rounded.empty() || rounded.dtype() != stored.dtype || !(rounded.shape() == stored.shape))
    rounded = Array(stored.shape, stored.dtype);
  if (n) convert(stored.dtype, rounded.data(), summed.dtype, summed.data, n);
  rule->updater(key, rounded.view(), stored);
}

void UpdateRuleSlot::set_updater(Updater updater) {
  auto rule = updater ? std::make_shared<const UpdateRule>(UpdateRule{std::move(updater), nullptr})
                      : std::shared_ptr<const UpdateRule>();
  std::lock_guard lock(mu_);
  rule_ = std::move(rule);
}

void UpdateRuleSlot::set_optimizer(const OptimizerSpec& spec) {
  auto rule = std::make_shared<const UpdateRule>(UpdateRule{{}, create_optimizer(spec)});
  std::lock_guard lock(mu_);
  rule_ = std::move(rule);
}

std::shared_ptr<const UpdateRule> UpdateRuleSlot::get() const {
  std::lock_guard lock(mu_);
  return rule_;
}

std::shared_ptr<Optimizer> UpdateRuleSlot::optimizer(const char* op) const {
  auto rule = get();
  if (!rule || !rule->optimizer)
    throw InvalidArgument(fmt::format(
        "{}: the store has no optimizer; call set_optimizer first (a custom updater has no "
        "states to save or load)",
        op));
  return rule->optimizer;
}

}  // namespace pushpull::kv
