// SPDX-License-Identifier: Apache-2.0
// Helpers of the same-host shared-memory tests (shm_host_test.cpp,
// shm_use_test.cpp, shm_squat_test.cpp): a private segment directory,
// use_shared_memory run on every rank at once, and a check that every
// ordered pair of ranks exchanges a message intact. A TempDir owns (and
// removes) its directory; choose() joins the threads it starts before it
// returns.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tcp_group.h"
#include "transport/shm/shm_data_transport.h"
#include "transport/shm/shm_host.h"

namespace pushpull::collective::shm_testing {

using transport::Clock;
using transport::decode_rank_record;
using transport::host_key;
using transport::HostProbe;
using transport::irecv;
using transport::isend;
using transport::kRankRecordBytes;
using transport::RankRecord;
using transport::Request;
using transport::SegmentsHook;
using transport::shm_group;
using transport::ShmDataTransport;
using transport::TcpTransport;
using transport::Transport;
using transport::use_shared_memory;

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / fmt::format("pushpull-shmhost-{:x}{:x}", rd(), rd());
    fs::create_directory(path);
    fs::permissions(path, fs::perms::owner_all);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  size_t entries() const {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(path))
      ++n;
    return n;
  }
};

// Runs use_shared_memory on every rank (rank r with dirs[r]) at once.
inline std::vector<std::unique_ptr<Transport>> choose(
    std::vector<std::unique_ptr<TcpTransport>> tcp, const std::vector<std::string>& dirs,
    bool enabled = true, uint64_t stream_below = 0, const SegmentsHook& hook = {}) {
  CollectiveOptions c;
  c.shared_memory = enabled;
  c.shm_min_message_bytes = stream_below;
  const size_t n = tcp.size();
  std::vector<std::unique_ptr<Transport>> out(n);
  std::vector<std::thread> th;
  for (size_t r = 0; r < n; ++r)
    th.emplace_back(
        [&, r] { out[r] = use_shared_memory(std::move(tcp[r]), c, Millis(10000), dirs[r], hook); });
  for (auto& t : th)
    t.join();
  return out;
}

// Every ordered pair exchanges a message; all arrive intact.
inline void every_pair_talks(std::vector<std::unique_ptr<Transport>>& ts) {
  const int n = static_cast<int>(ts.size());
  const size_t bytes = 300001;
  std::vector<std::vector<uint8_t>> in(static_cast<size_t>(n * n), std::vector<uint8_t>(bytes));
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n * n));
  std::vector<Request> reqs;
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      auto& o = out[static_cast<size_t>(s * n + d)];
      o.resize(bytes);
      for (size_t i = 0; i < bytes; ++i)
        o[i] = static_cast<uint8_t>(i * 7 + s * 31 + d);
      reqs.push_back(irecv(*ts[d], s, 5, in[static_cast<size_t>(s * n + d)].data(), bytes));
      reqs.push_back(isend(*ts[s], d, 5, o.data(), bytes));
    }
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (auto& r : reqs)
    r.wait(deadline, "a message between two ranks");
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      EXPECT_EQ(in[static_cast<size_t>(s * n + d)], out[static_cast<size_t>(s * n + d)])
          << s << " -> " << d;
    }
}

}  // namespace pushpull::collective::shm_testing
