// SPDX-License-Identifier: Apache-2.0
// What a store applies to a key's summed push: a user updater or one of the
// optimizers, held so that set_updater / set_optimizer never race with pushes
// in flight (each push captures the rule current when it was issued).
// Shared by the stores that update locally (local, device, dist_sync_allreduce).
//
// Thread safety: every method of UpdateRuleSlot may be called from any thread.
#pragma once

#include <memory>
#include <mutex>

#include "pushpull/kvstore.h"

namespace pushpull::kv {

struct UpdateRule {
  Updater updater;
  std::shared_ptr<Optimizer> optimizer;
};

// Applies a push's sum to a key's stored value, the same way in every store
// that updates locally: with an optimizer, optimizer->update(key, stored,
// summed) (summed may be float32 for 16-bit values: no rounding before the
// update); with an updater, updater(key, summed rounded to the key's dtype,
// stored); without a rule (null), the sum (converted to the key's dtype)
// replaces the value. `rounded` is scratch for the rounding (reused).
// summed and stored have the same shape; summed's dtype is the key's or float32.
void apply_update(const UpdateRule* rule, const Key& key, const ArrayView& summed,
                  const ArrayView& stored, Array& rounded);

class UpdateRuleSlot {
 public:
  // A null updater clears the rule (pushes then replace the value).
  void set_updater(Updater updater);
  // InvalidArgument for a bad spec (the rule is then unchanged).
  void set_optimizer(const OptimizerSpec& spec);
  // The current rule; null when none is set.
  std::shared_ptr<const UpdateRule> get() const;
  // The current optimizer, or InvalidArgument naming `op` when there is none.
  std::shared_ptr<Optimizer> optimizer(const char* op) const;

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const UpdateRule> rule_;
};

}  // namespace pushpull::kv
