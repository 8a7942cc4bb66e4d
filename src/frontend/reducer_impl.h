// SPDX-License-Identifier: Apache-2.0
// GradientReducer's state (private to src/frontend): the per-parameter round
// state guarded by one mutex, and the checks of reducer_setup.cpp.
// Thread safety: every field below `mu` is guarded by it.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pushpull/compression.h"
#include "pushpull/frontend/gradient_reducer.h"

namespace pushpull::frontend {

struct GradientReducer::Impl {
  struct Param {
    std::string name;
    std::string op_name;
    int group = -1;
    // Round state (mu).
    int passes = 0;
    bool claimed = false;    // handed out by grad_ready / take_unsubmitted
    bool submitted = false;  // its reduction is running
    ArrayView grad;          // where the result lands
    Array work;              // fp16 copy or this rank's codes (empty: in place on grad)
    collective::Handle handle;
  };
  // A reduction whose wait failed: its memory is kept until it is done.
  struct Lingering {
    collective::Handle handle;
    Array work;
  };

  Impl(CommunicatorFn c, std::vector<std::string> names, ReducerOptions o);
  collective::Communicator& comm() const { return comm_fn(); }
  int set_size() const {  // ranks that reduce (the global set: the current size)
    return o.process_set.empty() ? comm().size() : static_cast<int>(o.process_set.size());
  }
  // reducer_setup.cpp: option checks, process set, groups.
  void check_options();
  void setup_process_set();
  void setup_groups();

  std::vector<size_t> claim_group(int g, bool from_hook);  // mu held
  void finish(Param& p);                                   // mu held; may throw
  void reset(Param& p);                                    // mu held

  CommunicatorFn comm_fn;
  ReducerOptions o;
  std::vector<Param> params;
  std::vector<std::vector<size_t>> groups;
  bool member = true;
  std::unique_ptr<GradientCompressor> codes;  // 2bit / 1bit

  mutable std::mutex mu;
  std::vector<size_t> group_ready;   // ready members per group (mu)
  std::vector<Lingering> lingering;  // (mu)
  Stats stats;                       // (mu)
};

}  // namespace pushpull::frontend
