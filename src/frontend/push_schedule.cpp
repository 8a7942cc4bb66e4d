// SPDX-License-Identifier: Apache-2.0
#include "pushpull/frontend/push_schedule.h"

#include <fmt/format.h>

#include <algorithm>

#include "pushpull/error.h"

namespace pushpull::frontend {

PushSchedule::PushSchedule(const std::vector<std::vector<size_t>>& unit_members, size_t num_params,
                           int replicas, bool push_from_hooks)
    : unit_of_(num_params, SIZE_MAX), replicas_(replicas), push_from_hooks_(push_from_hooks) {
  if (replicas < 1) throw InvalidArgument(fmt::format("PushSchedule: {} replicas", replicas));
  for (size_t u = 0; u < unit_members.size(); ++u) {
    for (size_t i : unit_members[u]) {
      if (i >= num_params || unit_of_[i] != SIZE_MAX)
        throw InvalidArgument(fmt::format("PushSchedule: parameter {} of unit {}", i, u));
      unit_of_[i] = u;
    }
    members_.push_back(unit_members[u].size());
  }
  if (std::count(unit_of_.begin(), unit_of_.end(), SIZE_MAX) > 0)
    throw InvalidArgument("PushSchedule: a parameter is in no unit");
  ready_.assign(num_params, 0);
  complete_.assign(members_.size(), 0);
  pushed_.assign(members_.size(), 0);
}

PushSchedule::Outcome PushSchedule::grad_ready(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t u = unit_of_.at(i);
  if (!armed_) return {Ready::kWait, u};
  if (ready_[i] >= replicas_) return {Ready::kSecond, u};
  if (++ready_[i] < replicas_) return {Ready::kWait, u};
  if (++complete_[u] < members_[u]) return {Ready::kWait, u};
  pushed_[u] = 1;
  return {Ready::kPush, u};
}

void PushSchedule::push_failed(size_t u) {
  std::lock_guard<std::mutex> lock(mu_);
  pushed_.at(u) = 0;
}

bool PushSchedule::pushed(size_t u) const {
  std::lock_guard<std::mutex> lock(mu_);
  return pushed_.at(u) != 0;
}

void PushSchedule::disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
}

void PushSchedule::end_round() {
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(complete_.begin(), complete_.end(), 0);
  std::fill(pushed_.begin(), pushed_.end(), 0);
  armed_ = push_from_hooks_;
}

}  // namespace pushpull::frontend
