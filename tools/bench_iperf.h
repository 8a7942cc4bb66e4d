// SPDX-License-Identifier: Apache-2.0
// iperf3 over loopback, measured in the same run as a benchmark (see
// bench_iperf.cpp). Needs Debian's iperf3 (make deps installs it).
#pragma once

#include <optional>
#include <utility>

namespace pushpull::cli {

// One single-stream iperf3 run of `seconds` over loopback: {bytes moved,
// seconds}, or nullopt when iperf3 is missing or its output is unreadable.
std::optional<std::pair<double, double>> iperf3_once(int seconds);

}  // namespace pushpull::cli
