// SPDX-License-Identifier: Apache-2.0
// `pushpull bench allreduce` internals shared by its two files:
// bench_allreduce.cpp (command line, launching pushpull ranks and the peers,
// the table) and bench_allreduce_worker.cpp (one pushpull rank).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pushpull::cli {

struct WorkerArgs {
  int rank = -1;
  int size = 0;
  std::string host = "127.0.0.1";  // where this rank listens
  std::string rendezvous_dir;
  std::vector<uint64_t> sizes;  // bytes
  std::vector<int> iters;       // per size
  int warmup = 2;
  std::string transport = "tcp";  // or "shm": transport::ShmTransport (one host)
  // "none", or "fp16": the float32 gradient is fp16-compressed (with a
  // residual), allreduced as float16 and decoded back, all inside the timing;
  // "2bit"/"1bit": encoded (with a residual), the codes allgathered round the
  // ring and summed in rank order (compress/gathered.h), inside the timing.
  std::string compression = "none";
  // "flat": collective::allreduce; "hier": collective::hierarchical_allreduce
  // over the hosts of the rendezvous book (ranks publishing one address are one host).
  std::string algo = "flat";
};

// Runs one rank (blocking); rank 0 prints "result <bytes> <median_us>" lines.
int run_allreduce_worker(const WorkerArgs& args);

// impl -> bytes -> one median per repeat (in repeat order).
using RepeatMedians = std::map<std::string, std::map<uint64_t, std::vector<double>>>;

// The compressed rows' summary (bench_allreduce_codecs.cpp): the bytes each
// codec sends per rank and its speed-up over the uncompressed "pushpull"
// row of the same run, overall and per repeat.
void print_codec_summary(const std::vector<std::string>& codecs, const std::vector<uint64_t>& sizes,
                         int n, const RepeatMedians& got);

}  // namespace pushpull::cli
