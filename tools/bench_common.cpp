// SPDX-License-Identifier: Apache-2.0
#include "bench_common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::cli {

void add_bench_flags(CLI::App* cmd, BenchFlags* flags) {
  cmd->add_option("--format", flags->format, "Output: table (readable) or csv")
      ->check(CLI::IsMember({"table", "csv"}));
  cmd->add_option("--impl", flags->impl, "all: pushpull and its peers; pushpull: pushpull only")
      ->check(CLI::IsMember({"all", "pushpull"}));
}

void BenchTable::print(const std::string& title) {
  if (flags_.csv()) {
    if (!header_done_) std::printf("impl,n,bytes,median_us,algbw_GBps,busbw_GBps\n");
    header_done_ = true;
    for (auto& r : rows_)
      std::printf("%s,%d,%llu,%.3f,%.4f,%.4f\n", r.impl.c_str(), r.n,
                  static_cast<unsigned long long>(r.bytes), r.median_us, r.algbw_GBps,
                  r.busbw_GBps);
  } else {
    std::printf("\n%s\n", title.c_str());
    std::printf("%-20s %4s %12s %14s %12s %12s\n", "impl", "n", "size", "median_us", "algbw_GB/s",
                "busbw_GB/s");
    for (auto& r : rows_)
      std::printf("%-20s %4d %12s %14.2f %12.3f %12.3f\n", r.impl.c_str(), r.n,
                  format_bytes(r.bytes).c_str(), r.median_us, r.algbw_GBps, r.busbw_GBps);
  }
  std::fflush(stdout);
  rows_.clear();
}

double median(std::vector<double> v) {
  std::erase_if(v, [](double x) { return !std::isfinite(x); });
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

PairedRatio paired_ratio(const std::vector<double>& impl, const std::vector<double>& base) {
  std::vector<double> ratios;
  for (size_t i = 0; i < std::min(impl.size(), base.size()); ++i)
    if (std::isfinite(impl[i]) && std::isfinite(base[i]) && base[i] > 0)
      ratios.push_back(impl[i] / base[i]);
  PairedRatio r;
  if (ratios.empty()) return r;
  r.rounds = ratios.size();
  r.median = median(ratios);
  r.min = *std::min_element(ratios.begin(), ratios.end());
  r.max = *std::max_element(ratios.begin(), ratios.end());
  return r;
}

std::string format_paired(const PairedRatio& r) {
  if (r.rounds == 0) return "";
  if (r.rounds == 1) return fmt::format("{:.3f}", r.median);
  return fmt::format("{:.3f} ({:.3f}-{:.3f})", r.median, r.min, r.max);
}

std::string paired_csv(const PairedRatio& r) {
  if (r.rounds == 0) return ",,";
  return fmt::format("{:.3f},{:.3f},{:.3f}", r.median, r.min, r.max);
}

namespace {
uint64_t parse_size(std::string t) {
  if (t.empty()) throw InvalidArgument("empty size");
  uint64_t mult = 1;
  char last = static_cast<char>(std::toupper(static_cast<unsigned char>(t.back())));
  if (last == 'B') {
    t.pop_back();
    last = t.empty() ? '0' : static_cast<char>(std::toupper(static_cast<unsigned char>(t.back())));
  }
  if (last == 'K') mult = 1 << 10;
  if (last == 'M') mult = 1 << 20;
  if (last == 'G') mult = 1ull << 30;
  if (mult != 1) t.pop_back();
  try {
    size_t pos = 0;
    uint64_t v = std::stoull(t, &pos);
    if (pos != t.size()) throw std::invalid_argument(t);
    return v * mult;
  } catch (const std::exception&) {
    throw InvalidArgument(fmt::format("'{}' is not a size (use e.g. 4096, 64K, 16M, 1G)", t));
  }
}
}  // namespace

std::vector<uint64_t> parse_sizes(const std::string& text) {
  std::vector<uint64_t> out;
  if (auto dots = text.find(".."); dots != std::string::npos) {
    uint64_t lo = parse_size(text.substr(0, dots)), hi = parse_size(text.substr(dots + 2));
    if (lo == 0 || lo > hi) throw InvalidArgument(fmt::format("size range '{}' is empty", text));
    for (uint64_t s = lo; s <= hi; s *= 2)
      out.push_back(s);
    return out;
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    out.push_back(parse_size(text.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string format_bytes(uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

}  // namespace pushpull::cli
