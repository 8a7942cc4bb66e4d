// SPDX-License-Identifier: Apache-2.0
// Private helper of distributed_optimizer.cpp: the libtorch options as the
// torch-free GradientReducer's (pushpull/frontend/gradient_reducer.h). Pure.
#pragma once

#include <string>
#include <vector>

#include "pushpull/frontend/gradient_reducer.h"
#include "pushpull/torch/distributed_optimizer.h"

namespace pushpull::torch::detail {

// `o` as ReducerOptions over the reduced parameters `names` (groups' names
// become indices). Throws InvalidArgument for a group name not in `names`;
// the reducer checks the rest.
frontend::ReducerOptions reducer_options(const DistributedOptimizerOptions& o,
                                         const std::vector<std::string>& names);

}  // namespace pushpull::torch::detail
