// SPDX-License-Identifier: Apache-2.0
// The engine and the public API over the in-process transport: every op and
// dtype at world sizes 1..8, negotiation, fusion, postscales, large tensors
// and submission orders. Mismatch, stalls, join and dead ranks:
// communicator_faults_test.cpp.
#include "pushpull/collective.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <random>

#include "group.h"
#include "harness.h"

namespace pushpull::collective {
namespace {

using testing::fast_options;
using testing::Group;
using testing::input_value;
using testing::make_input;
using testing::reference;

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                         DType::kInt32,   DType::kInt64,   DType::kInt8,     DType::kUInt8};
const Reduction kReductions[] = {Reduction::kSum, Reduction::kAverage, Reduction::kMin,
                                 Reduction::kMax, Reduction::kProduct};

ReduceOp base_op(Reduction r) {
  switch (r) {
    case Reduction::kMin:
      return ReduceOp::kMin;
    case Reduction::kMax:
      return ReduceOp::kMax;
    case Reduction::kProduct:
      return ReduceOp::kProd;
    default:
      return ReduceOp::kSum;
  }
}

// The expected element, computed locally; average as the engine defines it
// (sum, then divided by n, integers truncated).
double expected(Reduction red, DType dtype, int n, int64_t i, int contributors = -1) {
  double v = reference(base_op(red), dtype, n, i);
  if (red != Reduction::kAverage) return v;
  double k = contributors < 0 ? n : contributors;
  return is_floating(dtype) ? v / k : std::trunc(v / k);
}

bool near(double got, double want, DType dtype) {
  double tol = dtype == DType::kFloat16    ? 2e-3 * std::max(1.0, std::abs(want))
               : dtype == DType::kBFloat16 ? 1e-2 * std::max(1.0, std::abs(want))
               : is_floating(dtype)        ? 1e-6 * std::max(1.0, std::abs(want))
                                           : 0.0;
  return std::abs(got - want) <= tol;
}

std::vector<int64_t> sizes_for(int n) {
  return {0, 1, 11, int64_t{7} * n + 1, 20001};  // 7n+1: not divisible by n
}

// Every reduction x dtype x size submitted at once (so fusion packs them),
// plus broadcast from every root, allgather with uneven rows and
// reduce_scatter, at every world size.
TEST(Communicator, EveryOpDtypeAndWorldSizeBatched) {
  for (int n = 1; n <= 8; ++n) {
    SCOPED_TRACE(n);
    Group g(n);
    g.run([&](int r, Communicator& c) {
      struct Op {
        Handle h;
        Reduction red;
        DType dtype;
        int64_t count;
        Array data;
      };
      std::vector<Op> ops;
      for (DType d : kDTypes)
        for (Reduction red : kReductions)
          for (int64_t count : sizes_for(n)) {
            Array a = make_input(base_op(red), d, r, count);
            std::string name = fmt::format("t.{}.{}.{}", dtype_name(d), reduction_name(red), count);
            Handle h = c.allreduce_async(name, a, a, red);
            ops.push_back(Op{h, red, d, count, std::move(a)});
          }
      std::vector<Array> bcast;
      std::vector<Handle> bh;
      for (int root = 0; root < n; ++root) {
        bcast.emplace_back(Shape{1000 + root}, DType::kInt32);
        if (r == root)
          for (int64_t i = 0; i < 1000 + root; ++i)
            set_element(bcast.back(), i, i * 3 + root);
        bh.push_back(c.broadcast_async(fmt::format("b.{}", root), bcast.back(), root));
      }
      Array mine(Shape{r % 3, 2}, DType::kFloat64);
      for (int64_t i = 0; i < mine.numel(); ++i)
        set_element(mine, i, r * 100 + i);
      Handle ag = c.allgather_async("gather", mine);
      Array rs_in = make_input(ReduceOp::kSum, DType::kFloat32, r, 3 * n + 2);
      Handle rs = c.reduce_scatter_async("scatter", rs_in);
      c.barrier();

      for (auto& op : ops) {
        c.wait(op.h);
        for (int64_t i = 0; i < op.count; ++i) {
          double got = get_element(op.data, i), want = expected(op.red, op.dtype, n, i);
          ASSERT_TRUE(near(got, want, op.dtype))
              << fmt::format("rank {} n {} {} {} count {} [{}]: got {} want {}", r, n,
                             dtype_name(op.dtype), reduction_name(op.red), op.count, i, got, want);
        }
      }
      for (int root = 0; root < n; ++root) {
        c.wait(bh[static_cast<size_t>(root)]);
        for (int64_t i = 0; i < 1000 + root; ++i)
          ASSERT_EQ(get_element(bcast[static_cast<size_t>(root)], i), i * 3 + root);
      }
      Array all = c.take_output(ag);
      int64_t row = 0;
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < (q % 3) * 2; ++i, ++row)
          ASSERT_EQ(get_element(all, row), q * 100 + i) << "allgather rank " << r;
      ASSERT_EQ(all.shape()[0] * 2, row);
      Array part = c.take_output(rs);
      auto rows = static_cast<int64_t>(3 * n + 2);
      int64_t q = rows / n, m = rows % n, first = r * q + std::min<int64_t>(r, m);
      ASSERT_EQ(part.numel(), q + (r < m ? 1 : 0));
      for (int64_t i = 0; i < part.numel(); ++i)
        ASSERT_EQ(get_element(part, i), reference(ReduceOp::kSum, DType::kFloat32, n, first + i));
    });
  }
}

// One op at a time (no fusion): small ones take halving-doubling, large ones
// the ring, in the caller's buffer; output distinct from input.
TEST(Communicator, SingleOpsBothAlgorithms) {
  for (int n : {2, 3, 5, 8}) {
    Group g(n);
    g.run([&](int r, Communicator& c) {
      for (int64_t count : {int64_t{7}, int64_t{1000}, int64_t{100003}}) {
        for (Reduction red : {Reduction::kSum, Reduction::kAverage, Reduction::kMax}) {
          Array in = make_input(base_op(red), DType::kFloat32, r, count);
          Array out(Shape{count}, DType::kFloat32);
          c.allreduce(fmt::format("s{}", count), in, out, red);
          for (int64_t i = 0; i < count; ++i)
            ASSERT_TRUE(
                near(get_element(out, i), expected(red, DType::kFloat32, n, i), DType::kFloat32))
                << "n " << n << " count " << count << " [" << i << "]";
        }
      }
    });
  }
}

TEST(Communicator, APostscaleMultipliesTheResultSingleFusedAndJoined) {
  // Ops with different factors (fused only with their own), single (large)
  // ops, kSum and kAverage; then a rank that has joined, which contributes
  // nothing and takes the factor from the others' specs.
  const int n = 3;
  Group g(n);
  g.run([&](int r, Communicator& c) {
    EXPECT_THROW(
        c.allreduce_async("inf", Array(Shape{1}, DType::kFloat32), Array(Shape{1}, DType::kFloat32),
                          Reduction::kSum, {}, std::numeric_limits<double>::infinity()),
        InvalidArgument);
    for (Reduction red : {Reduction::kSum, Reduction::kAverage}) {
      struct Op {
        Handle h;
        double factor;
        Array in, out;
      };
      std::vector<Op> ops;
      for (int k = 0; k < 12; ++k) {
        const int64_t count = k < 10 ? 5 + k : 300001;  // the last two: single ops
        const double factor = k < 5 ? 0.5 : 0.25 * k;
        Op op{{},
              factor,
              make_input(ReduceOp::kSum, DType::kFloat32, r, count),
              Array(Shape{count}, DType::kFloat32)};
        op.h = c.allreduce_async(fmt::format("p{}", k), op.in, op.out, red, {}, factor);
        ops.push_back(std::move(op));
      }
      for (auto& op : ops) {
        c.wait(op.h);
        for (int64_t i = 0; i < op.out.view().numel(); i += 7)
          ASSERT_TRUE(near(get_element(op.out, i), expected(red, DType::kFloat32, n, i) * op.factor,
                           DType::kFloat32))
              << "rank " << r << " factor " << op.factor << " [" << i << "]";
      }
    }
    if (r == 2) {
      c.join();
      return;
    }
    std::vector<float> v(100, static_cast<float>(r + 1));  // 1 + 2, rank 2 joined
    c.wait(c.allreduce_async("after join", ArrayView(v.data(), Shape{100}),
                             ArrayView(v.data(), Shape{100}), Reduction::kSum, {}, 1.0 / 3));
    EXPECT_FLOAT_EQ(v[0], 1.0f);
    EXPECT_FLOAT_EQ(v[99], 1.0f);
    c.join();
  });
}

TEST(Communicator, DifferentPostscalesFailOnEveryRank) {
  Group g(2);
  g.run([&](int r, Communicator& c) {
    Array a(Shape{4}, DType::kFloat32);
    try {
      c.wait(c.allreduce_async("grads", a, a, Reduction::kSum, {}, r == 0 ? 0.5 : 0.25));
      FAIL() << "rank " << r << " did not fail";
    } catch (const InvalidArgument& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("grads"), std::string::npos) << m;
      EXPECT_NE(m.find("postscale 0.25"), std::string::npos) << m;
    }
  });
}

TEST(Communicator, LargeAllreduceTensOfMiB) {
  Group g(4);
  const int64_t count = (32 << 20) / 4;
  g.run([&](int r, Communicator& c) {
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
      v[i] = static_cast<float>((i + r) % 17);
    c.allreduce("big", ArrayView(v.data(), Shape{count}));
    for (int64_t i = 0; i < count; i += 997) {
      float want = 0;
      for (int q = 0; q < 4; ++q)
        want += static_cast<float>((i + q) % 17);
      ASSERT_EQ(v[i], want);
    }
  });
}

TEST(Communicator, DifferentSubmissionOrdersComplete) {
  const int n = 5, k = 24;
  Group g(n);
  for (int iter = 0; iter < 3; ++iter) {  // repeats go through the response cache
    g.run([&](int r, Communicator& c) {
      std::vector<int> order(k);
      for (int i = 0; i < k; ++i)
        order[i] = i;
      std::mt19937 rng(static_cast<unsigned>(r * 31 + iter));
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<std::vector<int64_t>> data(k);
      std::vector<Handle> hs(k);
      for (int i : order) {
        data[i].assign(static_cast<size_t>(i * 50 + 1), r + i);
        hs[i] = c.allreduce_async(fmt::format("grad{}", i),
                                  ArrayView(data[i].data(), Shape{i * 50 + 1}));
      }
      for (int i = 0; i < k; ++i) {
        c.wait(hs[i]);
        for (int64_t v : data[i])
          ASSERT_EQ(v, n * i + n * (n - 1) / 2);
      }
    });
  }
}

}  // namespace
}  // namespace pushpull::collective
