// SPDX-License-Identifier: Apache-2.0
#include "reducer_options.h"

#include <algorithm>

#include "pushpull/error.h"

namespace pushpull::torch::detail {

frontend::ReducerOptions reducer_options(const DistributedOptimizerOptions& o,
                                         const std::vector<std::string>& names) {
  frontend::ReducerOptions r;
  r.backward_passes_per_step = o.backward_passes_per_step;
  r.average_aggregated_gradients = o.average_aggregated_gradients;
  r.op = o.op;
  r.name_prefix = o.name_prefix;
  static_assert(static_cast<int>(Compression::kOneBit) ==
                static_cast<int>(frontend::GradCompression::kOneBit));  // the same order
  r.compression = static_cast<frontend::GradCompression>(o.compression);
  r.compression_threshold = o.compression_threshold;
  r.process_set = o.process_set;
  r.gradient_predivide_factor = o.gradient_predivide_factor;
  r.num_groups = o.num_groups;
  for (const auto& group : o.groups) {
    std::vector<size_t> indices;
    for (const auto& name : group) {
      auto it = std::find(names.begin(), names.end(), name);
      if (it == names.end()) {
        throw InvalidArgument("DistributedOptimizer: groups names '" + name +
                              "', which is not a parameter the optimizer reduces");
      }
      indices.push_back(static_cast<size_t>(it - names.begin()));
    }
    r.groups.push_back(std::move(indices));
  }
  return r;
}

}  // namespace pushpull::torch::detail
