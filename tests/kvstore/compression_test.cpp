// SPDX-License-Identifier: Apache-2.0
// Gradient compression through the stores, MXNet nightly style: every worker
// pushes known gradients, and the value after each round must be what the
// residual arithmetic of each worker's codec gives, computed here by a scalar
// reference model (not the codec under test).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kvstore/store_jobs.h"
#include "pushpull/dtype.h"
#include "pushpull/error.h"

namespace pushpull {
namespace {

using testing::JobShape;
using testing::run_store_job;

// The scalar model of one worker's codec: returns the value that travels and
// updates the residual (docs/kvstore.md "Gradient compression").
float model_send(const std::string& type, float threshold, float& r, float g) {
  r += g;
  float q;
  if (type == "2bit") {
    q = r >= threshold ? threshold : (r <= -threshold ? -threshold : 0.0f);
  } else if (type == "1bit") {
    q = r > threshold ? 1.0f : -1.0f;
  } else if (type == "fp16") {
    q = half_to_float(float_to_half(r));
  } else {
    q = r;
  }
  r -= q;
  return q;
}

// Worker w's gradient at element i: alternating signs, per-worker size, so
// every code of every type shows up.
float grad_of(int w, int64_t i) {
  return (i % 2 ? -1.0f : 1.0f) * 0.3f * static_cast<float>(w + 1);
}

struct Case {
  std::string store;
  std::string type;
  DType dtype;
  int64_t numel;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.store << "/" << c.type << "/" << dtype_name(c.dtype) << "/" << c.numel;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.store + "_" + info.param.type + "_" +
         std::string(dtype_name(info.param.dtype)) + "_" + std::to_string(info.param.numel);
}

class CompressedRounds : public ::testing::TestWithParam<Case> {};

// dist_sync and dist_sync_allreduce: after each round every worker pulls
// init + sum over rounds of sum over workers of what they sent.
TEST_P(CompressedRounds, ValueAfterEachRoundFollowsTheResidualArithmetic) {
  const Case c = GetParam();
  const int n = 3, rounds = 4;
  const float threshold = c.type == "1bit" ? 0.0f : 0.5f;
  const bool ring = c.store == "dist_sync_allreduce";
  // The model, element classes 0 (even) and 1 (odd) for every worker.
  std::vector<std::vector<float>> expect(rounds, std::vector<float>(2));
  {
    std::vector<std::vector<float>> r(n, std::vector<float>(2, 0.0f));
    float w[2] = {1.0f, 1.0f};
    for (int round = 0; round < rounds; ++round)
      for (int cls = 0; cls < 2; ++cls) {
        float sum = 0;
        for (int k = 0; k < n; ++k) {
          float g = grad_of(k, cls);
          if (c.dtype == DType::kFloat16) g = half_to_float(float_to_half(g));  // the pushed array
          sum += model_send(c.type, threshold, r[k][cls], g);
        }
        w[cls] += sum;  // optimizer "test": w += grad, in float32
        if (c.dtype == DType::kFloat16) w[cls] = half_to_float(float_to_half(w[cls]));
        expect[round][cls] = w[cls];
      }
  }
  std::map<std::string, std::string> params{{"type", c.type}};
  if (c.type == "2bit" || c.type == "1bit") params["threshold"] = c.type == "1bit" ? "0" : "0.5";
  run_store_job(c.store, JobShape{n, 2, 1000}, [&](KVStore& kv) {
    kv.set_gradient_compression(params);
    Shape shape{c.numel};
    kv.init(5, Array::full(shape, 1.0, c.dtype).view());
    kv.set_optimizer(OptimizerSpec::parse("test:rescale_grad=1"));
    Array g(shape, c.dtype), out(shape, c.dtype);
    for (int64_t i = 0; i < c.numel; ++i)
      set_element(g, i, grad_of(kv.rank(), i));
    for (int round = 0; round < rounds; ++round) {
      kv.push(5, g.view());
      kv.pull(5, out.view());
      for (int64_t i :
           {int64_t{0}, int64_t{1}, c.numel / 2, c.numel / 2 + 1, c.numel - 2, c.numel - 1}) {
        const double want = expect[static_cast<size_t>(round)][static_cast<size_t>(i % 2)];
        const double got = get_element(out, i);
        if (c.type == "none") {
          // Uncompressed float32 sums depend on the arrival order of the pushes.
          ASSERT_NEAR(got, want, 1e-6 * (1 + std::fabs(want))) << "round " << round << " i " << i;
        } else if (ring && c.type == "fp16") {
          // The ring rounds each partial sum to float16: close, not exact.
          ASSERT_NEAR(got, want, 4e-3 * (1 + std::fabs(want)))
              << "round " << round << " i " << i << " worker " << kv.rank();
        } else {
          ASSERT_EQ(got, want) << "round " << round << " i " << i << " worker " << kv.rank();
        }
      }
    }
  });
}

std::vector<Case> rounds_cases() {
  std::vector<Case> cases;
  for (const char* type : {"none", "2bit", "1bit", "fp16"})
    for (DType dt : {DType::kFloat32, DType::kFloat16})
      for (int64_t numel : {int64_t{6}, int64_t{2001}})  // one server; split over both
        cases.push_back({"dist_sync", type, dt, numel});
  for (const char* type : {"2bit", "1bit", "fp16"})  // float64 keys: coded from float32
    cases.push_back({"dist_sync", type, DType::kFloat64, 2001});
  // 1bit/2bit: allgathered codes summed in rank order, exactly the model's sum.
  for (const char* type : {"2bit", "1bit", "fp16"}) {
    for (DType dt : {DType::kFloat32, DType::kFloat16})
      for (int64_t numel : {int64_t{6}, int64_t{2001}})
        cases.push_back({"dist_sync_allreduce", type, dt, numel});
    cases.push_back({"dist_sync_allreduce", type, DType::kFloat64, 2001});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Types, CompressedRounds, ::testing::ValuesIn(rounds_cases()), case_name);

// dist_async: rounds interleave, but once every worker's pushes are applied
// the value is init + everything every worker sent.
TEST(CompressedAsync, EveryCompressedPushIsAppliedOnce) {
  const int n = 2, pushes = 5;
  for (const char* type : {"2bit", "1bit", "fp16"}) {
    const float threshold = std::string(type) == "1bit" ? 0.0f : 0.5f;
    float want[2] = {1.0f, 1.0f};
    for (int cls = 0; cls < 2; ++cls)
      for (int k = 0; k < n; ++k) {
        float r = 0;
        for (int p = 0; p < pushes; ++p)
          want[cls] += model_send(type, threshold, r, grad_of(k, cls));
      }
    std::map<std::string, std::string> params{{"type", type}};
    if (std::string(type) != "fp16") params["threshold"] = std::to_string(threshold);
    run_store_job("dist_async", JobShape{n, 2, 1000}, [&](KVStore& kv) {
      kv.set_gradient_compression(params);
      kv.init(1, Array::full(Shape{1500}, 1.0).view());
      kv.set_optimizer(OptimizerSpec::parse("test:rescale_grad=1"));
      Array g(Shape{1500}, DType::kFloat32), out(Shape{1500}, DType::kFloat32);
      for (int64_t i = 0; i < 1500; ++i)
        set_element(g, i, grad_of(kv.rank(), i));
      for (int p = 0; p < pushes; ++p)
        kv.push(1, g.view());
      kv.barrier();
      kv.pull(1, out.view());
      for (int64_t i : {0, 1, 1498, 1499})
        EXPECT_NEAR(get_element(out, i), want[i % 2], 1e-5) << type << " i " << i;
    });
  }
}

// Integer keys are never compressed (nothing to quantise), on every store.
TEST(CompressedPushes, IntegerKeysTravelAsTheyAre) {
  for (const char* store : {"dist_sync", "dist_sync_allreduce"})
    run_store_job(store, JobShape{2, 1, 1000}, [&](KVStore& kv) {
      kv.set_gradient_compression({{"type", "fp16"}});
      kv.init(1, Array::full(Shape{4}, 0.0, DType::kInt32).view());
      Array g = Array::full(Shape{4}, 70000.0, DType::kInt32), out(Shape{4}, DType::kInt32);
      kv.push(1, g.view());
      kv.pull(1, out.view());
      EXPECT_EQ(get_element(out, 3), 140000.0) << store;
    });
}

// ---- Where each setting applies, and the same error for the same mistake ----

std::string error_of(KVStore& kv, const std::map<std::string, std::string>& params) {
  try {
    kv.set_gradient_compression(params);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(CompressionSettings, EveryStoreGivesTheParsersErrorsAndSaysWhatItRefuses) {
  const std::vector<std::map<std::string, std::string>> bad = {
      {{"type", "3bit"}},
      {{"type", "2bit"}, {"threshold", "-1"}},
      {{"type", "2bit"}, {"threshold", "x"}},
      {{"type", "fp16"}, {"threshold", "0.5"}},
      {{"ratio", "1"}}};
  std::vector<std::vector<std::string>> errors;
  for (const char* store : {"local", "device", "dist_sync", "dist_sync_allreduce"}) {
    std::vector<std::string> mine;
    run_store_job(store, JobShape{1, 1, 1000}, [&](KVStore& kv) {
      for (const auto& p : bad)
        mine.push_back(error_of(kv, p));
      kv.set_gradient_compression({{"type", "none"}});  // accepted everywhere
      const std::string type = kv.type();
      const std::string twobit = error_of(kv, {{"type", "2bit"}});
      const std::string fp16 = error_of(kv, {{"type", "fp16"}});
      if (type == "local" || type == "device") {
        EXPECT_NE(twobit.find("nothing leaves this process"), std::string::npos) << twobit;
        EXPECT_NE(fp16.find("nothing to compress"), std::string::npos) << fp16;
      } else {  // dist_sync and dist_sync_allreduce (an allgather of codes) take every type
        EXPECT_EQ(twobit, "");
        EXPECT_EQ(error_of(kv, {{"type", "1bit"}}), "");
        EXPECT_EQ(fp16, "");
      }
    });
    errors.push_back(mine);
  }
  for (size_t s = 1; s < errors.size(); ++s)
    EXPECT_EQ(errors[s], errors[0]) << "store " << s;
  for (const auto& e : errors[0])
    EXPECT_NE(e, "");
}

}  // namespace
}  // namespace pushpull
