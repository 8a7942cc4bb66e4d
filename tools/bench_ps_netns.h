// SPDX-License-Identifier: Apache-2.0
// `pushpull bench ps --netns N`: the parameter-server benchmark as real
// processes on N network-namespace hosts with rate-limited links (see
// bench_netns.h). Each host runs one server and one worker; host 0 also runs
// the scheduler. Every worker pushpulls one float32 key per size and per
// compression type, interleaved within each iteration, after a barrier; the
// figure is the median over iterations of the slowest worker's time.
//
// Ownership: the lab, the processes and the temporary directory are owned by
// the call and removed before it returns (also on error). Needs root.
// Thread safety: none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pushpull::cli {

struct PsNetnsArgs {
  int hosts = 4;
  std::string rate = "1gbit";
  std::vector<uint64_t> sizes;            // bytes
  std::vector<std::string> compressions;  // "none", "fp16", "2bit", "1bit"
  int iters = 10;
  int timeout_s = 600;
};

struct PsNetnsRow {
  std::string compression;
  uint64_t bytes = 0;
  double median_us = 0;
};

// Runs the job; `goodput_bps` gets iperf3's single-stream goodput between two
// hosts (0 when iperf3 is missing).
std::vector<PsNetnsRow> run_ps_netns(const PsNetnsArgs& args, double* goodput_bps);

// `bytes` random bytes as hex: a fresh job secret for the namespace hosts.
std::string random_hex(size_t bytes);

// One node of that job (started by run_ps_netns with the DMLC_* environment
// of its role): servers and the scheduler serve and exit inside
// create_kvstore; a worker runs the timing loop and writes its times to
// `out_dir`/times.<rank>.
void run_ps_node(const std::vector<uint64_t>& sizes, const std::vector<std::string>& compressions,
                 int iters, const std::string& out_dir);

}  // namespace pushpull::cli
