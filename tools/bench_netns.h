// SPDX-License-Identifier: Apache-2.0
// Network namespaces as hosts for `pushpull bench allreduce --netns N`: a hub
// namespace holding a bridge, N host namespaces each with one veth "eth0"
// on it, every port shaped with `tc ... tbf` to the given rate (both
// directions of every link), so ranks talk over real, rate-limited links.
//
// Ownership: the lab creates its namespaces (names carry this process's id,
// so parallel runs never collide) and its destructor deletes them, which
// removes their links too. A guardian process (a shell in its own session,
// started with the lab) also deletes them, after killing whatever still runs
// inside, when this process ends without running the destructor (a signal,
// SIGKILL included): it waits for EOF on a pipe only this process holds open.
// Needs root (CAP_NET_ADMIN) and iproute2; the
// constructor throws IoError saying so when a step fails, after undoing the
// steps already made. Traffic stays inside the namespaces.
// Thread safety: none.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pushpull::cli {

class NetnsLab {
 public:
  // `rate` as tc takes it ("1gbit"); empty: unshaped. `queue_ms`: tbf's
  // latency, the longest a packet may wait in a port's queue (the switch
  // buffer; 50 ms at 1 Gbit/s is 6 MB, deeper than most switches give a port).
  NetnsLab(int hosts, const std::string& rate, int queue_ms = 50);
  ~NetnsLab();
  NetnsLab(const NetnsLab&) = delete;
  NetnsLab& operator=(const NetnsLab&) = delete;

  int hosts() const { return static_cast<int>(ns_.size()); }
  const std::string& ns(int h) const { return ns_[static_cast<size_t>(h)]; }
  const std::string& address(int h) const { return addr_[static_cast<size_t>(h)]; }
  // argv prefix running a program inside host h: ip netns exec NS.
  std::vector<std::string> exec(int h) const;
  // Single-stream TCP goodput from host 0 to host 1 in bit/s (iperf3 for
  // `seconds`); 0 when iperf3 is missing or its output is unreadable.
  double goodput_bps(int seconds) const;
  // Bytes host h's link has received and sent so far (its eth0 counters);
  // {0, 0} when they cannot be read.
  std::pair<uint64_t, uint64_t> link_bytes(int h) const;

 private:
  void teardown();
  void start_guardian(int id, int hosts);
  std::string hub_;
  int guardian_fd_ = -1;  // write end of the guardian's stdin; closing it = "clean up now"
  int guardian_pid_ = -1;
  std::vector<std::string> ns_, addr_;
};

}  // namespace pushpull::cli
