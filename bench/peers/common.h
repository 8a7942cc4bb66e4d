// SPDX-License-Identifier: Apache-2.0
// Shared by the peer drivers of `pushpull bench allreduce`: argument parsing
// and the result line format, so every driver times the same way.
//
// Timing convention (the same as the pushpull worker): per iteration, a
// barrier, then the allreduce timed on every rank; the iteration's time is the
// slowest rank's (a max-reduction of the per-rank times after the loop, so it
// does not disturb the timed region). Rank 0 prints one line per size:
//   result <bytes> <median_us>
// Buffers are float32, summed, initialised to the rank's id.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace peers {

struct Args {
  std::vector<uint64_t> sizes;  // bytes
  std::vector<int> iters;       // per size
  int warmup = 2;
  std::string host = "127.0.0.1";  // gloo: the address to listen on
};

// "--sizes 4096,65536 --iters 50,20 --warmup 2" (after driver-specific args).
inline bool parse(int argc, char** argv, int first, Args* a) {
  auto list = [](const char* s, auto* out) {
    std::string t(s);
    size_t pos = 0;
    while (pos <= t.size()) {
      size_t e = t.find(',', pos);
      if (e == std::string::npos) e = t.size();
      out->push_back(static_cast<typename std::decay_t<decltype(*out)>::value_type>(
          std::strtoull(t.substr(pos, e - pos).c_str(), nullptr, 10)));
      pos = e + 1;
    }
  };
  for (int i = first; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--sizes")
      list(argv[i + 1], &a->sizes);
    else if (k == "--iters")
      list(argv[i + 1], &a->iters);
    else if (k == "--warmup")
      a->warmup = std::atoi(argv[i + 1]);
    else if (k == "--host")
      a->host = argv[i + 1];
    else
      return false;
  }
  if (a->iters.size() == 1) a->iters.resize(a->sizes.size(), a->iters[0]);
  return !a->sizes.empty() && a->iters.size() == a->sizes.size();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

inline void print_result(uint64_t bytes, const std::vector<double>& max_us) {
  std::printf("result %llu %.3f\n", static_cast<unsigned long long>(bytes), median(max_us));
  std::fflush(stdout);
}

}  // namespace peers
