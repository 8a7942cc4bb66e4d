// SPDX-License-Identifier: Apache-2.0
// Value checks shared by the tests of every distributed store type, so each
// type is held to exactly the same expectations.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pushpull/kvstore.h"

namespace pushpull::testing {

inline std::vector<double> values_of(const Array& a) {
  std::vector<double> v(static_cast<size_t>(a.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = get_element(a, static_cast<int64_t>(i));
  return v;
}

struct RoundCase {
  DType dtype;
  int64_t rows, cols;
};

// float32 and float16, small and above the big-array bound.
inline auto round_cases() {
  return ::testing::Values(RoundCase{DType::kFloat32, 2, 3}, RoundCase{DType::kFloat16, 2, 3},
                           RoundCase{DType::kFloat32, 1200, 1200},
                           RoundCase{DType::kFloat16, 1200, 1200});
}
inline std::string round_case_name(const ::testing::TestParamInfo<RoundCase>& info) {
  return std::string(dtype_name(info.param.dtype)) + "_" + std::to_string(info.param.rows);
}

// Run by each of `n` workers: after round i in which every worker w pushes
// ones*(w+1), with optimizer test (rescale_grad=2), every worker pulls
// (N+1)*N/2*2*i + 1 (init 1).
inline void check_closed_form_rounds(KVStore& kv, const RoundCase& c, int n) {
  Shape shape{c.rows, c.cols};
  kv.init(7, Array::full(shape, 1.0, c.dtype));
  kv.set_optimizer(OptimizerSpec::parse("test:rescale_grad=2"));
  Array grad = Array::full(shape, kv.rank() + 1.0, c.dtype);
  Array out(shape, c.dtype);
  for (int round = 1; round <= 3; ++round) {
    kv.push(7, grad.view());
    kv.pull(7, out.view());
    double expect = (n + 1) * n / 2.0 * 2 * round + 1;
    auto v = values_of(out);
    ASSERT_EQ(v.front(), expect) << "round " << round << " worker " << kv.rank();
    ASSERT_EQ(v.back(), expect);
    ASSERT_EQ(v[v.size() / 2], expect);
  }
}

}  // namespace pushpull::testing
