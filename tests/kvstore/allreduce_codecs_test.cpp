// SPDX-License-Identifier: Apache-2.0
// 1bit and 2bit on dist_sync_allreduce (each worker encodes with its own
// residual, the codes are allgathered, every worker sums them in rank
// order), and fp16 (float16 on the ring): the pulled value against a scalar model of the codecs
// (not the codecs under test), over 2, 3 and 4 workers on every transport the algorithm suite uses
// (in-process, TCP on loopback, shared memory); the same bits on every worker; the residual
// carrying across pushes; workers with different settings refused on every worker with an error
// saying so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collective/fabrics.h"
#include "kvstore/allreduce_store.h"
#include "pushpull/dtype.h"
#include "pushpull/error.h"

namespace pushpull {
namespace {

using collective::testing::Kind;

collective::CommunicatorOptions comm_options() {
  collective::CommunicatorOptions c;
  c.peer_timeout = Millis(5000);
  c.wait_timeout = Millis(30000);
  c.collective.cycle_time_ms = 0.5;
  return c;
}

// body(store) for n workers on n threads, each an AllreduceStore over its own
// communicator; rethrows the first exception. A worker that throws destroys
// its store, which fails the others' pending collectives instead of leaving
// them waiting.
void run_workers(Kind kind, int n, const std::function<void(KVStore&)>& body) {
  auto ts = collective::testing::connect_group(kind, n);
  Options o;
  o.kvstore.wait_timeout = Millis(30000);
  o.kvstore.engine_threads = 2;
  collective::testing::on_threads(n, [&](int r) {
    auto comm = std::make_unique<collective::Communicator>(std::move(ts[static_cast<size_t>(r)]),
                                                           comm_options());
    AllreduceStore store("dist_sync_allreduce", o, std::move(comm));
    body(store);
  });
}

// The scalar model of one worker's codec (two_bit.h, one_bit.h): returns the
// value the code stands for and updates the residual.
float model_send(const std::string& type, float t, float& r, float g) {
  r += g;
  float q;
  if (type == "2bit")
    q = r >= t ? t : (r <= -t ? -t : 0.0f);
  else if (type == "1bit")
    q = r > t ? 1.0f : -1.0f;
  else  // fp16
    q = half_to_float(float_to_half(r));
  r -= q;
  return q;
}

// Worker w's gradient at element i of push p: every code of both types shows
// up, and the pattern differs by worker, element and push.
float grad_of(int w, int64_t i, int p) {
  return static_cast<float>((i * 7 + w * 3 + p * 5) % 11 - 5) * 0.15f;
}

struct Case {
  Kind kind;
  int n;
  std::string type;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const std::string& t = info.param.type;
  return collective::testing::kind_name(info.param.kind) + "_" + std::to_string(info.param.n) +
         "ranks_" +
         (t == "1bit"   ? "OneBit"
          : t == "2bit" ? "TwoBit"
                        : "Fp16");
}

class AllgatheredCodecs : public ::testing::TestWithParam<Case> {};

// Three pushes of varying gradients: after each, every worker pulls exactly
// the model's rank-order sum (0 + q_0) + q_1 + ... (fp16, summed on the ring
// with float16 partial sums: within float16's rounding), and all workers
// hold the same bits. 100,003 values: several of the sum's blocks, a partial
// last word.
TEST_P(AllgatheredCodecs, EveryWorkerPullsTheModelsRankOrderSum) {
  const Case c = GetParam();
  const int n = c.n, pushes = 3;
  const int64_t numel = 100003;
  const float t = 0.5f;
  // want[p][i]: the model, every worker's residual carried across pushes.
  std::vector<std::vector<float>> want(pushes, std::vector<float>(static_cast<size_t>(numel)));
  {
    std::vector<std::vector<float>> res(n, std::vector<float>(static_cast<size_t>(numel), 0.0f));
    for (int p = 0; p < pushes; ++p)
      for (int64_t i = 0; i < numel; ++i) {
        float sum = 0.0f;
        for (int w = 0; w < n; ++w)
          sum += model_send(c.type, t, res[w][static_cast<size_t>(i)], grad_of(w, i, p));
        want[p][static_cast<size_t>(i)] = sum;
      }
  }
  std::vector<std::vector<float>> got(static_cast<size_t>(n));  // last push, by worker
  run_workers(c.kind, n, [&](KVStore& kv) {
    if (c.type == "fp16")
      kv.set_gradient_compression({{"type", "fp16"}});
    else
      kv.set_gradient_compression({{"type", c.type}, {"threshold", "0.5"}});
    kv.init(3, Array::full(Shape{numel}, 7.0).view());
    Array g(Shape{numel}, DType::kFloat32), out(Shape{numel}, DType::kFloat32);
    for (int p = 0; p < pushes; ++p) {
      for (int64_t i = 0; i < numel; ++i)
        g.as<float>()[i] = grad_of(kv.rank(), i, p);
      kv.push(3, g.view());  // no updater: the value becomes the sum
      kv.pull(3, out.view());
      const float* o = out.as<float>();
      for (int64_t i = 0; i < numel; ++i) {
        const float w = want[p][static_cast<size_t>(i)];
        if (c.type == "fp16")  // the ring rounds each partial sum to float16: close, not exact
          ASSERT_NEAR(o[i], w, 4e-3 * (1 + std::fabs(w)))
              << "push " << p << " element " << i << " worker " << kv.rank();
        else
          ASSERT_EQ(o[i], w) << "push " << p << " element " << i << " worker " << kv.rank();
      }
    }
    got[static_cast<size_t>(kv.rank())].assign(out.as<float>(), out.as<float>() + numel);
  });
  for (int w = 1; w < n; ++w)
    EXPECT_EQ(std::memcmp(got[static_cast<size_t>(w)].data(), got[0].data(),
                          static_cast<size_t>(numel) * sizeof(float)),
              0)
        << "worker " << w << " differs from worker 0";
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Kind k : {Kind::kInProcess, Kind::kTcp, Kind::kShm})
    for (int n : {2, 3, 4})
      for (const char* type : {"2bit", "1bit", "fp16"})
        out.push_back({k, n, type});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Transports, AllgatheredCodecs, ::testing::ValuesIn(cases()), case_name);

// A gradient of 0.3 everywhere, pushed twice with threshold 0.5: the first
// code of every worker stays below the threshold (2bit: 0; 1bit: -1) and the
// residual of 0.3 makes the second one cross it (2bit: +0.5 with 0.1 left;
// 1bit: 1.3 + 0.3 > 0.5, so +1). Closed form: 2bit sums 0 then 0.5 n; 1bit
// -n then +n. Without the residual the second push would repeat the first.
TEST(AllgatheredCodecs, TheResidualCarriesToTheNextPush) {
  const int n = 3;
  for (const char* type : {"2bit", "1bit"}) {
    const bool two = std::string(type) == "2bit";
    const float first = two ? 0.0f : -static_cast<float>(n);
    const float second = two ? 0.5f * n : static_cast<float>(n);
    run_workers(Kind::kInProcess, n, [&](KVStore& kv) {
      kv.set_gradient_compression({{"type", type}, {"threshold", "0.5"}});
      kv.init(1, Array::full(Shape{70}, 0.0).view());
      kv.set_optimizer(OptimizerSpec::parse("test:rescale_grad=1"));  // w += sum
      Array g = Array::full(Shape{70}, 0.3), out(Shape{70}, DType::kFloat32);
      kv.push(1, g.view());
      kv.pull(1, out.view());
      for (int64_t i : {0, 31, 32, 69})
        ASSERT_EQ(get_element(out, i), first) << type << " first push, element " << i;
      kv.push(1, g.view());
      kv.pull(1, out.view());
      for (int64_t i : {0, 31, 32, 69})
        ASSERT_EQ(get_element(out, i), first + second) << type << " second push, element " << i;
    });
  }
}

// What each worker's push throws (empty: it succeeded), worker w with settings[w].
std::vector<std::string> push_errors(const std::vector<std::map<std::string, std::string>>& s) {
  const int n = static_cast<int>(s.size());
  std::vector<std::string> errors(static_cast<size_t>(n));
  run_workers(Kind::kInProcess, n, [&](KVStore& kv) {
    kv.set_gradient_compression(s[static_cast<size_t>(kv.rank())]);
    kv.init(2, Array::full(Shape{100}, 0.0).view());
    try {
      kv.push(2, Array::full(Shape{100}, 1.0).view());
      kv.wait_all();
    } catch (const InvalidArgument& e) {
      errors[static_cast<size_t>(kv.rank())] = e.what();
    }
    kv.barrier();  // both answered before either store goes
  });
  return errors;
}

// Workers that set different compression fail the push on every worker,
// with an InvalidArgument that says why, instead of summing garbage.
TEST(AllgatheredCodecs, WorkersWithDifferentSettingsAreRefusedOnEveryWorker) {
  using P = std::map<std::string, std::string>;
  // Same type and length, different threshold: the codes' headers disagree.
  auto e = push_errors(
      {P{{"type", "1bit"}, {"threshold", "0.5"}}, P{{"type", "1bit"}, {"threshold", "0.25"}}});
  for (const auto& m : e) {
    EXPECT_NE(m.find("workers set different gradient compression"), std::string::npos) << m;
    EXPECT_NE(m.find("1bit(threshold=0.25)"), std::string::npos) << m;
  }
  // 1bit against 2bit: codes of different lengths (an allgather takes
  // those), so each worker reads the other's header.
  e = push_errors({P{{"type", "1bit"}}, P{{"type", "2bit"}}});
  EXPECT_NE(e[0].find("rank 1 sent 2bit(threshold=0.5), this worker uses 1bit"), std::string::npos)
      << e[0];
  EXPECT_NE(e[1].find("rank 0 sent 1bit(threshold=0.5), this worker uses 2bit"), std::string::npos)
      << e[1];
  // 1bit against fp16 (an allgather against an allreduce of one name): the
  // engine's signature check names the tensor.
  e = push_errors({P{{"type", "1bit"}}, P{{"type", "fp16"}}});
  for (const auto& m : e)
    EXPECT_NE(m.find("kv.2#0"), std::string::npos) << m;
}

}  // namespace
}  // namespace pushpull
