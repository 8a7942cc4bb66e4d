// SPDX-License-Identifier: Apache-2.0
// PushSchedule: the Trainers' step state machine, written once for both
// torch front ends (pushpull::torch::Trainer and pushpull.torch.Trainer):
// which store key (unit, frontend/key_packing.h) a hook pushes when, and
// which ones step() still has to push.
//
// A round: while armed (from the second step on, with push_from_hooks),
// grad_ready(i) counts parameter i's gradients (one per replica); once a
// unit's every member has every replica's gradient, it answers kPush and the
// binding starts that unit's exchange (push_failed(u) if it could not);
// a gradient beyond the replicas' count answers kSecond (the binding raises
// its error). step() calls disarm(), pushes every unit not pushed(u), waits,
// and end_round() starts the next round (armed again with push_from_hooks).
//
// Ownership: plain values. Thread safety: every method may be called from
// any thread (hooks run on autograd's threads); one mutex inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace pushpull::frontend {

class PushSchedule {
 public:
  // unit_members: each unit's parameter indices (every parameter below
  // num_params in exactly one unit); replicas >= 1. InvalidArgument otherwise.
  PushSchedule(const std::vector<std::vector<size_t>>& unit_members, size_t num_params,
               int replicas, bool push_from_hooks);

  enum class Ready { kWait, kPush, kSecond };
  struct Outcome {
    Ready what = Ready::kWait;
    size_t unit = 0;  // parameter i's unit
  };
  // One of parameter i's gradients is in. Not armed: kWait, nothing counted.
  Outcome grad_ready(size_t i);
  // The hook could not start unit u's exchange: step() pushes it.
  void push_failed(size_t u);
  bool pushed(size_t u) const;
  size_t unit_of(size_t i) const { return unit_of_.at(i); }
  size_t num_units() const { return members_.size(); }
  // step() begins: no hook pushes until end_round().
  void disarm();
  // The round is over (whatever happened): counts cleared, armed again
  // with push_from_hooks.
  void end_round();

 private:
  mutable std::mutex mu_;
  std::vector<size_t> members_;  // per unit: how many parameters
  std::vector<size_t> unit_of_;
  int replicas_;
  bool push_from_hooks_;
  bool armed_ = false;            // the first step pushes from step() (init first)
  std::vector<int> ready_;        // per parameter: replicas whose gradient is in
  std::vector<size_t> complete_;  // per unit: members with every gradient in
  std::vector<uint8_t> pushed_;   // per unit
};

}  // namespace pushpull::frontend
