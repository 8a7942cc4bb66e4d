// SPDX-License-Identifier: Apache-2.0
// The variables that tell a worker its place in the job, under torchrun's,
// pushpull's and Horovod's names: one table for the launcher (a fixed job's
// workers, launch/plan.cpp), for an elastic worker's every round
// (collective/elastic_client.cpp) and for Python's os.environ
// (collective::rank_environment()), so they never disagree on a name.
//
// Thread safety: pure.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace pushpull {

// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, their PUSHPULL_ twins and
// HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, with their values.
inline std::vector<std::pair<const char*, std::string>> rank_variables(int rank, int size,
                                                                       int local_rank,
                                                                       int local_size) {
  const std::string r = std::to_string(rank), s = std::to_string(size),
                    lr = std::to_string(local_rank), ls = std::to_string(local_size);
  return {{"RANK", r},
          {"PUSHPULL_RANK", r},
          {"WORLD_SIZE", s},
          {"PUSHPULL_WORLD_SIZE", s},
          {"LOCAL_RANK", lr},
          {"PUSHPULL_LOCAL_RANK", lr},
          {"LOCAL_WORLD_SIZE", ls},
          {"PUSHPULL_LOCAL_SIZE", ls},
          {"HOROVOD_RANK", r},
          {"HOROVOD_SIZE", s},
          {"HOROVOD_LOCAL_RANK", lr},
          {"HOROVOD_LOCAL_SIZE", ls}};
}

// rank_variables and HOROVOD_CROSS_RANK / HOROVOD_CROSS_SIZE: this host's
// index and the number of hosts, assuming the same number of ranks on each
// (Horovod's homogeneous case), as an elastic round sets them.
inline std::vector<std::pair<const char*, std::string>> round_variables(int rank, int size,
                                                                        int local_rank,
                                                                        int local_size) {
  auto vars = rank_variables(rank, size, local_rank, local_size);
  const int per_host = std::max(1, local_size);
  vars.emplace_back("HOROVOD_CROSS_RANK", std::to_string(rank / per_host));
  vars.emplace_back("HOROVOD_CROSS_SIZE", std::to_string(std::max(1, size / per_host)));
  return vars;
}

}  // namespace pushpull
