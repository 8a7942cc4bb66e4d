// SPDX-License-Identifier: Apache-2.0
// `pushpull bench codec`: the gradient codecs' throughput on one core
// (docs/performance.md "Codecs").
//
// For each codec (--codecs, default 2bit,1bit,fp16) and size (--sizes,
// default 64M bytes of float32 gradient), one thread times, interleaved in
// every repeat so they share the machine's load:
//   encode      residual += grad, encoded, residual updated (a worker's push)
//   decode_add  sum += decoded (a server summing a push)
//   decode      out = decoded (a worker's compressed pull)
//   enc+dec     encode then decode_add: the figure the 4 GB/s is about
// for the vectorised kernels ("pushpull") and, for 2bit and 1bit, the scalar
// definitions of compress/reference.h ("scalar"), plus a memory baseline
// ("stream": sum += grad, the traffic of decode_add's accumulator). GB/s are
// 1e9 float32 gradient bytes per second (n * 4 / time), medians over
// --repeats; "ratio" lines pair each repeat's vectorised time with the
// scalar one. Inputs are normal random gradients (threshold 0.5), so the
// scalar code's branches are as unpredictable as real gradients make them.
#include <chrono>
#include <functional>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "bench_common.h"
#include "commands.h"
#include "compress/compressor.h"
#include "compress/reference.h"
#include "pushpull/kernels.h"

namespace pushpull::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  BenchFlags flags;
  std::string codecs = "2bit,1bit,fp16";
  std::string sizes = "64M";
  int repeats = 9;
};

double seconds(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Series {
  std::string impl;
  std::function<void()> run;
  std::vector<double> secs;
};

void bench_one(const Settings& st, const std::string& type, uint64_t bytes, BenchTable& table) {
  const size_t n = bytes / sizeof(float);
  std::map<std::string, std::string> params{{"type", type}};
  const compress::Settings settings = compress::parse_settings(params);
  const compress::Compressor c(settings);
  const compress::Codec& codec = c.codec();
  const float t = settings.threshold;
  std::vector<float> grad(n), res_new(n, 0.0f), res_ref(n, 0.0f), acc(n, 0.0f), out(n, 0.0f);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (auto& g : grad)
    g = normal(rng);
  std::vector<std::byte> wire(codec.compressed_bytes(n)), wire_ref(wire.size());
  const bool has_ref = type != "fp16";
  auto ref_encode = [&] {
    if (type == "2bit")
      compress::reference::two_bit_encode(grad.data(), res_ref.data(), wire_ref.data(), n, t);
    else
      compress::reference::one_bit_encode(grad.data(), res_ref.data(), wire_ref.data(), n, t);
  };
  auto ref_decode_add = [&] {
    if (type == "2bit")
      compress::reference::two_bit_decode_add(wire_ref.data(), acc.data(), n, t);
    else
      compress::reference::one_bit_decode_add(wire_ref.data(), acc.data(), n);
  };
  std::vector<Series> series;
  auto timed = [&](std::string impl, std::function<void()> run) {
    series.push_back(Series{std::move(impl), std::move(run), {}});
  };
  timed("pushpull_encode", [&] { codec.compress(grad.data(), res_new.data(), wire.data(), n); });
  timed("pushpull_decode_add", [&] { codec.decompress_add(wire.data(), acc.data(), n); });
  timed("pushpull_decode", [&] { codec.decompress(wire.data(), out.data(), n); });
  if (has_ref) {
    timed("scalar_encode", ref_encode);
    timed("scalar_decode_add", ref_decode_add);
  }
  timed("stream_sum", [&] { reduce_sum(DType::kFloat32, acc.data(), grad.data(), n); });
  for (auto& s : series)  // warm-up: pages, caches, the ifunc resolver
    s.run();
  for (int r = 0; r < st.repeats; ++r)
    for (auto& s : series)
      s.secs.push_back(seconds(s.run));
  auto find = [&](const std::string& impl) -> const std::vector<double>& {
    for (const auto& s : series)
      if (s.impl == impl) return s.secs;
    throw std::logic_error(impl);
  };
  auto add = [&](const std::string& impl, const std::vector<double>& secs) {
    const double m = median(secs);
    table.add(
        {fmt::format("{}_{}", impl, type), 1, bytes, m * 1e6, bytes / m / 1e9, bytes / m / 1e9});
  };
  auto sum_of = [](const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> s(a.size());
    for (size_t i = 0; i < a.size(); ++i)
      s[i] = a[i] + b[i];
    return s;
  };
  for (const auto& s : series)
    add(s.impl, s.secs);
  const auto both = sum_of(find("pushpull_encode"), find("pushpull_decode_add"));
  add("pushpull_enc+dec", both);
  std::string ratio;
  if (has_ref) {
    const auto both_ref = sum_of(find("scalar_encode"), find("scalar_decode_add"));
    add("scalar_enc+dec", both_ref);
    ratio = fmt::format(
        "  {} {}: time pushpull/scalar: encode {}, decode_add {}, enc+dec {}\n", type,
        format_bytes(bytes),
        format_paired(paired_ratio(find("pushpull_encode"), find("scalar_encode"))),
        format_paired(paired_ratio(find("pushpull_decode_add"), find("scalar_decode_add"))),
        format_paired(paired_ratio(both, both_ref)));
  }
  table.print(
      fmt::format("codec {} (one core, GB/s of float32 gradient, median of {})", type, st.repeats));
  if (!ratio.empty() && !st.flags.csv()) fmt::print("{}", ratio);
}

void run(const Settings& st) {
  BenchTable table(st.flags);
  for (const std::string& type : [&] {
         std::vector<std::string> out;
         size_t at = 0;
         while (at <= st.codecs.size()) {
           size_t comma = st.codecs.find(',', at);
           out.push_back(st.codecs.substr(at, comma == std::string::npos ? comma : comma - at));
           if (comma == std::string::npos) break;
           at = comma + 1;
         }
         return out;
       }())
    for (uint64_t bytes : parse_sizes(st.sizes))
      bench_one(st, type, bytes, table);
}

}  // namespace

void register_bench_codec(CLI::App& bench) {
  auto settings = std::make_shared<Settings>();
  auto* cmd = bench.add_subcommand("codec", "Gradient codecs' encode/decode throughput, one core");
  add_bench_flags(cmd, &settings->flags);
  cmd->add_option("--codecs", settings->codecs, "Codecs to time, from 2bit,1bit,fp16");
  cmd->add_option("--sizes", settings->sizes, "Gradient sizes in bytes, e.g. 64M or 1M,64M");
  cmd->add_option("--repeats", settings->repeats, "Repeats (the median is reported)")
      ->check(CLI::Range(1, 1000));
  cmd->callback([settings] { run(*settings); });
}

}  // namespace pushpull::cli
