// SPDX-License-Identifier: Apache-2.0
#include "kvstore/update_rule.h"

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::kv {

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
