// SPDX-License-Identifier: Apache-2.0
// The fixture of the store conformance suite (conformance_test.cpp,
// conformance_updates_test.cpp): the store jobs every Conformance test runs
// on (each instantiates the suite over kConformanceJobs), and values_of /
// filled to compare values. A Conformance test runs its job through
// store_jobs.h and owns nothing beyond it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "kvstore/store_jobs.h"

namespace pushpull::conformance_testing {

using testing::JobShape;

// "<type>[@<transport>]" (store_jobs.h), in the suite's instantiation order.
inline const std::vector<std::string> kConformanceJobs = {"local",
                                                          "device",
                                                          "dist_sync",
                                                          "dist_sync@tcp",
                                                          "dist_sync@inproc",
                                                          "dist_async",
                                                          "dist_async@tcp",
                                                          "dist_async@inproc",
                                                          "dist_sync_allreduce",
                                                          "dist_sync_allreduce@tcp",
                                                          "dist_sync_allreduce@shm"};

std::vector<double> values_of(const ArrayView& a) {
  std::vector<double> v(static_cast<size_t>(a.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = get_element(a, static_cast<int64_t>(i));
  return v;
}
std::vector<double> filled(int64_t n, double x) {
  return std::vector<double>(static_cast<size_t>(n), x);
}

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string job_ = GetParam();  // "<type>[@<transport>]" (store_jobs.h)
  const std::string type_ = testing::store_of(job_);
  bool async() const { return type_ == "dist_async"; }
  void run(const std::function<void(KVStore&)>& body, JobShape shape = {}) {
    testing::run_store_job(job_, shape, body);
  }
  std::string temp_path(const std::string& what) const {
    return ::testing::TempDir() + "/pp-conformance-" + what + "-" + type_ + "-" +
           std::to_string(::getpid());
  }
};

}  // namespace pushpull::conformance_testing
