// SPDX-License-Identifier: Apache-2.0
// Reduction kernels in GB/s of dst (bytes of dst per second), next to memcpy
// over the same buffers. Run: build/bin/kernels_bench
#include <benchmark/benchmark.h>

#include <cstring>

#include "pushpull/array.h"
#include "pushpull/kernels.h"

namespace {

using pushpull::Array;
using pushpull::DType;

void BM_Memcpy(benchmark::State& state) {
  size_t bytes = static_cast<size_t>(state.range(0));
  Array a(pushpull::Shape{static_cast<int64_t>(bytes)}, DType::kUInt8);
  Array b(pushpull::Shape{static_cast<int64_t>(bytes)}, DType::kUInt8);
  for (auto _ : state) {
    std::memcpy(a.data(), b.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void BM_ReduceSum(benchmark::State& state, DType dtype) {
  size_t bytes = static_cast<size_t>(state.range(0));
  int64_t n = static_cast<int64_t>(bytes / pushpull::dtype_size(dtype));
  Array a(pushpull::Shape{n}, dtype), b(pushpull::Shape{n}, dtype);
  for (auto _ : state) {
    pushpull::reduce_sum(dtype, a.data(), b.data(), static_cast<size_t>(n));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void BM_Scale(benchmark::State& state) {
  size_t bytes = static_cast<size_t>(state.range(0));
  int64_t n = static_cast<int64_t>(bytes / 4);
  Array a(pushpull::Shape{n}, DType::kFloat32);
  for (auto _ : state) {
    pushpull::scale(DType::kFloat32, a.data(), 0.999, static_cast<size_t>(n));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

constexpr int64_t kSmall = 256 << 10;  // fits in L2
constexpr int64_t kLarge = 64 << 20;   // memory bound

BENCHMARK(BM_Memcpy)->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(BM_ReduceSum, float32, DType::kFloat32)->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(BM_ReduceSum, float64, DType::kFloat64)->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(BM_ReduceSum, float16, DType::kFloat16)->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(BM_ReduceSum, bfloat16, DType::kBFloat16)->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(BM_ReduceSum, int32, DType::kInt32)->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(BM_ReduceSum, int8, DType::kInt8)->Arg(kSmall)->Arg(kLarge);
BENCHMARK(BM_Scale)->Arg(kSmall)->Arg(kLarge);

}  // namespace

BENCHMARK_MAIN();
