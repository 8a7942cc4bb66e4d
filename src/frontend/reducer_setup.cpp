// SPDX-License-Identifier: Apache-2.0
// GradientReducer's construction: the option checks, the process set and the
// groups (gradient_reducer.h). Collective-free.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "reducer_impl.h"

namespace pushpull::frontend {

using collective::Reduction;

GradientReducer::Impl::Impl(CommunicatorFn c, std::vector<std::string> names, ReducerOptions opts)
    : comm_fn(std::move(c)), o(std::move(opts)) {
  check_options();
  std::set<std::string> seen;
  for (auto& n : names) {
    if (!seen.insert(n).second) {
      throw InvalidArgument(fmt::format(
          "{}: the name '{}' appears twice in named_parameters; names must be unique (they "
          "name the reductions on every rank)",
          o.who, n));
    }
    Param p;
    p.op_name = o.name_prefix + n;
    p.name = std::move(n);
    params.push_back(std::move(p));
  }
  setup_process_set();
  setup_groups();
  if (o.compression == GradCompression::kTwoBit || o.compression == GradCompression::kOneBit) {
    // fmt's shortest form reads back as the same float (the parser's input is text).
    codes = std::make_unique<GradientCompressor>(std::map<std::string, std::string>{
        {"type", o.compression == GradCompression::kTwoBit ? "2bit" : "1bit"},
        {"threshold", fmt::format("{}", o.compression_threshold)}});
  }
}

void GradientReducer::Impl::check_options() {
  if (o.backward_passes_per_step < 1) {
    throw InvalidArgument(fmt::format("{}: backward_passes_per_step must be >= 1, got {}", o.who,
                                      o.backward_passes_per_step));
  }
  if (o.op != Reduction::kAverage && o.op != Reduction::kSum) {
    throw InvalidArgument(fmt::format("{}: op must be average or sum, got {}", o.who,
                                      collective::reduction_name(o.op)));
  }
  if (!(o.gradient_predivide_factor > 0) ||
      (o.gradient_predivide_factor != 1.0 && o.op != Reduction::kAverage)) {
    throw InvalidArgument(fmt::format(
        "{}: gradient_predivide_factor must be > 0, and other than 1 only with op average (it "
        "divides before the sum and multiplies the average back), got {}",
        o.who, o.gradient_predivide_factor));
  }
  if (o.num_groups < 0) {
    throw InvalidArgument(
        fmt::format("{}: groups (num_groups) must be >= 0, got {}", o.who, o.num_groups));
  }
}

void GradientReducer::Impl::setup_process_set() {
  const auto& comm = this->comm();
  std::set<int> ranks;
  for (int r : o.process_set) {
    const bool out = r < 0 || r >= comm.size();
    if (out || !ranks.insert(r).second) {
      throw InvalidArgument(
          fmt::format("{}: process_set names rank {} {}", o.who, r,
                      out ? fmt::format("outside 0..{}", comm.size() - 1) : std::string("twice")));
    }
  }
  // A set of every rank is the global set: no member list to negotiate.
  if (static_cast<int>(ranks.size()) == comm.size()) o.process_set.clear();
  std::sort(o.process_set.begin(), o.process_set.end());
  member = o.process_set.empty() || ranks.count(comm.rank()) > 0;
}

void GradientReducer::Impl::setup_groups() {
  if (o.groups.empty() && o.num_groups > 0 && !params.empty()) {
    // Horovod's split: k lists in order, the first n % k one longer.
    const size_t k = std::min(static_cast<size_t>(o.num_groups), params.size());
    const size_t size = params.size() / k, extra = params.size() % k;
    size_t start = 0;
    for (size_t g = 0; g < k; ++g) {
      const size_t end = start + size + (g < extra ? 1 : 0);
      std::vector<size_t> list;
      for (size_t i = start; i < end; ++i)
        list.push_back(i);
      groups.push_back(std::move(list));
      start = end;
    }
  } else {
    groups = o.groups;
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i : groups[g]) {
      if (i >= params.size()) {
        throw InvalidArgument(
            fmt::format("{}: group {} names parameter {} of {}", o.who, g, i, params.size()));
      }
      if (params[i].group >= 0) {
        throw InvalidArgument(
            fmt::format("{}: a parameter appears in two groups ('{}')", o.who, params[i].name));
      }
      params[i].group = static_cast<int>(g);
    }
  }
  group_ready.assign(groups.size(), 0);
}

}  // namespace pushpull::frontend
