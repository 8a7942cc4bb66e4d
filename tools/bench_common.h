// SPDX-License-Identifier: Apache-2.0
// Output and flag helpers shared by every `pushpull bench <what>`.
//
// Flags: --format table|csv (default table), --impl all|pushpull (pushpull:
// skip the peers). In csv mode the output is one header line then one row per
// measurement:
//   impl,n,bytes,median_us,algbw_GBps,busbw_GBps
// impl is "pushpull" (or a variant such as "pushpull_pingpong") or the peer's
// name; n the number of ranks/workers/nodes; GB/s are 1e9 bytes per second.
// A benchmark without a bus factor (point-to-point) repeats algbw in busbw.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace pushpull::cli {

struct BenchFlags {
  std::string format = "table";
  std::string impl = "all";
  bool csv() const { return format == "csv"; }
  bool peers() const { return impl == "all"; }
};

// Adds --format and --impl to `cmd`, validated by CLI11.
void add_bench_flags(CLI::App* cmd, BenchFlags* flags);

struct BenchRow {
  std::string impl;
  int n = 0;
  uint64_t bytes = 0;
  double median_us = 0;
  double algbw_GBps = 0;
  double busbw_GBps = 0;
};

// Collects rows and prints them as an aligned table (with a title) or csv.
class BenchTable {
 public:
  explicit BenchTable(const BenchFlags& flags) : flags_(flags) {}
  void add(BenchRow row) { rows_.push_back(std::move(row)); }
  // Prints the rows added since the last print; `title` only in table mode.
  void print(const std::string& title);

 private:
  BenchFlags flags_;
  std::vector<BenchRow> rows_;
  bool header_done_ = false;
};

// The median of the finite values (NaN marks a failed run); 0 when none.
double median(std::vector<double> v);

// Round by round, the ratio of an implementation's time to the baseline's
// in the same interleaved round (NaN: a failed run, skipped). Pairing
// cancels the machine's load drifting from round to round; min and max show
// the noise left. rounds == 0 when no round has both.
struct PairedRatio {
  double median = 0, min = 0, max = 0;
  size_t rounds = 0;
};
PairedRatio paired_ratio(const std::vector<double>& impl, const std::vector<double>& base);
// "0.781 (0.742-0.830)", "0.781" for one round, "" for none.
std::string format_paired(const PairedRatio& r);
// The CSV columns paired_median,paired_min,paired_max ("0.781,0.742,0.830";
// ",," for none).
std::string paired_csv(const PairedRatio& r);
// "4K..256M" (powers of two between), "1K,64K,1M" (a list) or "4096".
std::vector<uint64_t> parse_sizes(const std::string& text);
std::string format_bytes(uint64_t bytes);  // "64 KiB"

}  // namespace pushpull::cli
