// SPDX-License-Identifier: Apache-2.0
// `pushpull bench allreduce --compression ...`: what each codec sends and how
// much faster it is than the uncompressed ring of the same run.
#include <cmath>
#include <cstdio>

#include "bench_allreduce.h"
#include "bench_common.h"

namespace pushpull::cli {

void print_codec_summary(const std::vector<std::string>& codecs, const std::vector<uint64_t>& sizes,
                         int n, const RepeatMedians& got) {
  for (const std::string& comp : codecs)
    for (uint64_t bytes : sizes) {
      // A ring rank sends 2(n-1)/n of the buffer; an allgather of codes
      // (1bit: 1/32 of it, 2bit: 1/16) n-1 parts; the _rs rows 2(n-1)/n of
      // the codes.
      const double codes = comp.starts_with("1bit")   ? std::ceil(bytes / 4.0 / 32) * 4
                           : comp.starts_with("2bit") ? std::ceil(bytes / 4.0 / 16) * 4
                                                      : 0;
      const double ring = 2.0 * (n - 1) / n;
      const double sent = comp.ends_with("_rs") ? ring * codes
                          : codes > 0
                              ? (n - 1) * codes
                              : ring * static_cast<double>(bytes) / (comp == "fp16" ? 2 : 1);
      std::printf("wire %s %s: %.0f bytes sent per rank per allreduce\n", comp.c_str(),
                  format_bytes(bytes).c_str(), sent);
    }
  // The ratio of the medians, and of each repeat's: runs are interleaved, so
  // a repeat's pair saw the same machine.
  auto base = got.find("pushpull");
  if (base == got.end()) return;
  for (const std::string& comp : codecs) {
    auto mine = got.find("pushpull_" + comp);
    if (comp == "none" || mine == got.end()) continue;
    for (uint64_t bytes : sizes) {
      auto b = base->second.find(bytes), m = mine->second.find(bytes);
      if (b == base->second.end() || m == mine->second.end()) continue;
      std::printf("speed-up %s %s: %.2fx over pushpull (per repeat:", comp.c_str(),
                  format_bytes(bytes).c_str(), median(b->second) / median(m->second));
      if (b->second.size() == m->second.size())
        for (size_t i = 0; i < m->second.size(); ++i)
          std::printf(" %.2f", b->second[i] / m->second[i]);
      std::printf(")\n");
    }
  }
}

}  // namespace pushpull::cli
