// SPDX-License-Identifier: Apache-2.0
// The collectives' detector at scale and the run (scale_collective.h): after
// tcp_transport_liveness.cpp (heartbeats every interval, a peer silent for
// the timeout decided dead, a closed connection blamed after the grace, a
// decided verdict sent to every connected peer and adopted by them).
#include "sim/scale_collective.h"

namespace pushpull::sim::scale::detail {

namespace {
// bootstrap.cpp's rendezvous mode: grace = min(timeout / 2, 1.5 s).
uint64_t grace_us(const Config& c) {
  return std::min<uint64_t>(c.heartbeat_timeout_us / 2, 1'500'000);
}
std::string describe_rank(int r, int local_size) {
  return fmt::format("rank {} (host {}:{})", r, host_of(r, local_size), 41000 + r % 20000);
}
}  // namespace

void CollectiveWorld::start_liveness(int r) {
  live_[static_cast<size_t>(r)] = true;
  ++live_count_;
  if (watches(r, victim_)) {
    // Its detector starts watching every peer now (the victim among them).
    detectors_.emplace(r,
                       SilenceDetector<int>(net_.clock(), Millis(c_.heartbeat_timeout_us / 1000)));
    heard(r);
  }
  net_.at(net_.now() + c_.heartbeat_interval_us, [this, r] { beat(r); });
}

void CollectiveWorld::beat(int r) {
  // (After a false alarm the others keep beating: the steady state is
  // still measured, the run is marked invalid.)
  if (net_.down(r) || (injected_ && decided_count_ == n_ - 1)) return;
  if (r == victim_) {
    for (int w = 0; w < n_; ++w)
      if (watches(w, r)) net_.send(r, w, kHeader, [this, w] { heard(w); });
  } else {
    // Sent to every watched peer; received from those of them that
    // heartbeat already (their own mesh is complete), but the victim, whose
    // heartbeats are delivered one by one.
    const uint64_t deg = static_cast<uint64_t>(heartbeat_degree());
    uint64_t in = 0;
    if (full_) {
      in = static_cast<uint64_t>(live_count_ - 1);
    } else {
      for (int p : {(r + 1) % n_, (r + n_ - 1) % n_})
        in += p != r && live_[static_cast<size_t>(p)] ? 1 : 0;
      if (n_ == 2) in = std::min<uint64_t>(in, 1);
    }
    if (watches(r, victim_) && live_[static_cast<size_t>(victim_)]) --in;
    net_.lump(r, deg, in, kHeader);
  }
  net_.at(net_.now() + c_.heartbeat_interval_us, [this, r] { beat(r); });
}

void CollectiveWorld::heard(int w) {
  if (decided_[static_cast<size_t>(w)] != kNever) return;
  auto it = detectors_.find(w);
  if (it == detectors_.end()) return;  // not live yet: it starts watching then
  it->second.heard(victim_);
  const auto left = it->second.next_deadline() - net_.clock().now();
  const uint64_t at =
      net_.now() +
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(left).count());
  planned_[static_cast<size_t>(w)] = at;
  net_.at(at, [this, w] { check(w); });
}

void CollectiveWorld::check(int w) {
  if (decided_[static_cast<size_t>(w)] != kNever || net_.down(w)) return;
  if (auto e = detectors_.at(w).first_expired())
    decide(w, fmt::format("collective: {} failed: no heartbeat for {} ms (limit {} ms); it is "
                          "stopped, hung or unreachable",
                          describe_rank(e->first, c_.local_size), e->second.count(),
                          c_.heartbeat_timeout_us / 1000));
}

void CollectiveWorld::decide(int w, const std::string& why) {
  auto& d = decided_[static_cast<size_t>(w)];
  if (d != kNever) return;
  d = net_.now();
  if (!injected_)  // a false alarm: the run says so instead of a detection time
    fail_run(fmt::format("rank {} decided before the fault, at {:.2f} s simulated: {}", w,
                         static_cast<double>(net_.now()) / 1e6, why));
  if (decided_count_++ == 0) {
    report_.detect_first_s = static_cast<double>(net_.now() - fault_at_) / 1e6;
    report_.verdict = why;
  }
  if (decided_count_ == n_ - 1)
    report_.detect_all_s = static_cast<double>(net_.now() - fault_at_) / 1e6;
  // The verdict to every connected peer. A peer that will decide by itself
  // before this message is processed cannot change by it: counted only.
  const uint64_t bytes = kHeader + why.size();
  for (int p : neighbours(w)) {
    if (p == victim_) continue;
    if (decided_[static_cast<size_t>(p)] != kNever) {
      net_.send_counted(w, p, bytes);
      continue;
    }
    const uint64_t t = net_.send_counted(w, p, bytes);
    if (t >= planned_[static_cast<size_t>(p)]) continue;
    net_.at(t, [this, p, why] { decide(p, why); });
  }
}

void CollectiveWorld::inject() {
  injected_ = true;
  net_.stop(victim_);
  if (c_.fault != Fault::kKill) return;
  // Every connected peer sees the connection close and blames the victim
  // after the grace, unless a verdict came first.
  for (int p : neighbours(victim_)) {
    const uint64_t at = net_.now() + c_.costs.latency_us + grace_us(c_);
    planned_[static_cast<size_t>(p)] = std::min(planned_[static_cast<size_t>(p)], at);
    net_.at(at, [this, p] {
      decide(p, fmt::format("collective: {} failed: its connection closed (connection closed by "
                            "the peer)",
                            describe_rank(victim_, c_.local_size)));
    });
  }
}

Report CollectiveWorld::run() {
  report_.engine = full_ ? "collective full mesh" : "collective sparse";
  report_.ranks = n_;
  if (n_ < 2) {
    fail_run("the simulation needs 2 ranks or more");
    return report_;
  }
  for (int r = 1; r < n_; ++r)
    rendezvous(r);
  // Ten minutes simulated: the real connect_all gives up after 30 s.
  const uint64_t limit = kStartupLimitUs;
  while (!second_done_ && net_.now() < limit)
    if (!net_.run(net_.now() + 100'000)) break;
  if (!second_done_ || reduced_ != n_) {
    if (ready_ < n_) report_.startup_s = -1;  // not complete
    const std::string why = fmt::format(
        "start-up and the allreduce did not complete within {} s simulated ({} of {} "
        "ranks ready, {} reduced)",
        limit / 1'000'000, ready_, n_, reduced_);
    report_.failure = report_.failure.empty() ? why : report_.failure + "; " + why;
    report_.events = net_.events();
    return report_;
  }
  const std::vector<Count> zero(startup_counts_.size());
  auto field = [](uint64_t Count::*f) {
    return [f](const Count& c) { return static_cast<double>(c.*f); };
  };
  report_.connections = spread(
      zero, startup_counts_, [](const Count& c) { return c.connections; }, 1, n_, 0);
  report_.startup_messages = spread(zero, startup_counts_, field(&Count::messages), 1, n_, 0);
  report_.startup_bytes = spread(zero, startup_counts_, field(&Count::bytes), 1, n_, 0);
  report_.startup_s = static_cast<double>(startup_done_) / 1e6;
  report_.round_ms = static_cast<double>(round_end_ - startup_done_) / 1e3;
  report_.values_ok = true;
  report_.op_messages_hub = 2.0 * (n_ - 1);
  report_.op_bytes_hub_first = op_bytes_[0];
  report_.op_bytes_hub_cached = op_bytes_[1];
  report_.op_messages_hub_tree = tree_hub_messages_;
  report_.op_bytes_hub_tree = tree_hub_bytes_;
  report_.negotiate_direct_ms = static_cast<double>(tree_start_ - round_end_) / 1e3;
  report_.negotiate_tree_ms = static_cast<double>(tree_end_ - tree_start_) / 1e3;
  // Steady state: three intervals, one interval after the ops.
  const uint64_t iv = c_.heartbeat_interval_us, t1 = net_.now() + iv;
  net_.run(t1);
  const auto before = net_.counts();
  net_.run(t1 + 3 * iv);
  const auto& now = net_.counts();
  report_.heartbeat_messages = spread(before, now, field(&Count::messages), 1, n_, 0, 3);
  report_.heartbeat_bytes = spread(before, now, field(&Count::bytes), 1, n_, 0, 3);
  report_.heartbeat_cpu = spread(before, now, field(&Count::busy_us), 1, n_, 0, 3.0 * iv);
  fault_at_ = net_.now() + iv / 3;
  net_.at(fault_at_, [this] { inject(); });
  const uint64_t end = fault_at_ + c_.heartbeat_timeout_us + 30'000'000;
  while (decided_count_ < n_ - 1 && net_.now() < end)
    if (!net_.run(net_.now() + 100'000)) break;
  if (decided_count_ < n_ - 1)
    fail_run(fmt::format("only {} of {} live ranks named the victim", decided_count_, n_ - 1));
  report_.events = net_.events();
  return report_;
}

}  // namespace pushpull::sim::scale::detail

namespace pushpull::sim::scale {

Report run_collective(const Config& c) {
  detail::CollectiveWorld w(c);
  return w.run();
}

}  // namespace pushpull::sim::scale
