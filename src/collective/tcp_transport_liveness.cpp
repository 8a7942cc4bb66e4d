// SPDX-License-Identifier: Apache-2.0
// TcpTransport's failure detector (see tcp_transport.h): heartbeats to every
// peer on their own thread, the silence and suspect decisions, and the
// verdict that fails every operation and is told to every peer.
#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "collective/tcp_transport.h"
#include "pushpull/log.h"

namespace pushpull::collective {

void TcpTransport::heard(net::ConnId conn) {
  if (!silence_) return;
  int p = peer_of(conn);
  if (p >= 0 && !dead_[static_cast<size_t>(p)]) silence_->heard(p);
}

int TcpTransport::peer_of(net::ConnId conn) {
  auto r = rank_of_.find(conn);
  return r == rank_of_.end() ? -1 : r->second;
}

void TcpTransport::on_control(net::Message&& m) {
  std::unique_lock lock(mu_);
  heard(m.conn);
  int from = peer_of(m.conn);
  if (m.header.type == kByeType && from >= 0) left_[static_cast<size_t>(from)] = true;
  if (m.header.type != kVerdictType) return;  // a heartbeat: heard() is all
  if (from < 0 || m.payload.size() > kMaxVerdictBytes) return;
  std::string text(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
  lock.unlock();
  PP_DEBUG("collective: {} reports: {}", describe(from), text);
  decide(Status(ErrorCode::kPeerFailure, std::move(text)), false);
}

void TcpTransport::decide(const Status& verdict, bool tell) {
  std::vector<Completion> failed;
  std::vector<net::ConnId> peers;
  std::vector<std::pair<Key, net::ConnId>> in_net;  // data receives net may be filling
  std::function<void(const Status&)> hook;
  {
    std::lock_guard lock(mu_);
    if (closed_ || !verdict_.decide(verdict)) return;
    hook = on_verdict_;
    for (auto it = posted_.begin(); it != posted_.end();) {
      if (registered_.count(it->first)) {
        in_net.emplace_back(it->first, conns_[static_cast<size_t>(it->first.first)]);
        ++it;
      } else {
        failed.push_back(std::move(it->second.done));
        it = posted_.erase(it);
      }
    }
    for (auto& done : held_)
      failed.push_back(std::move(done));
    held_.clear();
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && conns_[static_cast<size_t>(r)] && !dead_[static_cast<size_t>(r)])
        peers.push_back(conns_[static_cast<size_t>(r)]);
  }
  cv_.notify_all();
  if (tell) {
    std::string text = verdict.message().substr(0, kMaxVerdictBytes);
    for (net::ConnId c : peers)
      net_.send_copy(c, net::Header{.type = kVerdictType}, text.data(), text.size(),
                     kUrgentPriority);
  }
  if (hook) hook(verdict);
  // Wakes a thread waiting on the data streams at once (it then reports the
  // verdict): shutting down only our reading side, so the peers see nothing.
  if (streams_ready_)
    for (auto& fd : streams_)
      if (fd.valid()) ::shutdown(fd.get(), SHUT_RD);
  // A data receive posted to net may only fail once net let go of its
  // buffer: withdrawn here, or (already being filled) when net completes it.
  for (const auto& [key, conn] : in_net) {
    if (!net_.cancel_recv(conn, net::RecvMatch{kDataType, key.second, 0})) continue;
    std::lock_guard lock(mu_);
    registered_.erase(key);
    auto it = posted_.find(key);
    if (it == posted_.end()) continue;
    failed.push_back(std::move(it->second.done));
    posted_.erase(it);
  }
  for (auto& done : failed)
    done(verdict);
}

void TcpTransport::declare(const Status& verdict) {
  decide(Status(ErrorCode::kPeerFailure, verdict.message()), true);
}

std::optional<Status> TcpTransport::verdict() const {
  std::lock_guard lock(mu_);
  return verdict_.failure();
}

void TcpTransport::abort(const Status& why) {
  bool quiet;
  {
    // After a peer shut down in order the group is ending: an operation that
    // failed on that is no failure of the job (no verdict).
    std::lock_guard lock(mu_);
    quiet = why.code() == ErrorCode::kPeerFailure && !verdict_.failure() &&
            std::find(left_.begin(), left_.end(), true) != left_.end();
  }
  // A peer failure names the node already (a verdict, a lost connection);
  // anything else is this rank's own failure.
  if (!quiet) {
    if (why.code() == ErrorCode::kPeerFailure)
      decide(why, true);
    else
      decide(
          Status(ErrorCode::kPeerFailure,
                 fmt::format("collective: {} {}: {}", describe(rank_),
                             why.code() == ErrorCode::kTimeout ? "ended the collectives" : "failed",
                             why.message())),
          true);
  }
  net_.drain(Millis{500});  // lets the verdict reach the peers
  close(why);
}

void TcpTransport::start_liveness(LivenessConfig config) {
  std::lock_guard lock(mu_);
  if (live_thread_.joinable() || closed_) return;
  live_ = std::move(config);
  verdict_ = Verdict(*live_.clock);
  silence_.emplace(*live_.clock, live_.heartbeat_timeout);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (dead_[static_cast<size_t>(r)])
      verdict_.suspect(peer_error(r, *dead_[static_cast<size_t>(r)]), live_.grace);
    else
      silence_->heard(r);
  }
  live_thread_ = std::thread([this] {
    ScopedLogContext ctx(fmt::format("collective rank {} liveness", rank_));
    liveness_loop();
  });
}

void TcpTransport::liveness_loop() {
  const ClockSource& clock = *live_.clock;
  std::unique_lock lock(mu_);
  // Heartbeats go out on real time; the silence and suspect decisions read
  // the configured clock. Waits are at most one interval either way.
  using Real = std::chrono::steady_clock;
  auto next_beat = Real::now();
  while (!live_stop_) {
    auto decide_at = verdict_.suspect_deadline();
    if (live_.detect && !verdict_.failure())
      decide_at = std::min(decide_at, silence_->next_deadline());
    auto left = std::clamp(std::chrono::duration_cast<Millis>(next_beat - Real::now()), Millis{0},
                           live_.heartbeat_interval);
    if (decide_at != ClockSource::time_point::max())
      left = std::min(
          left, std::max(Millis{0}, std::chrono::duration_cast<Millis>(decide_at - clock.now())));
    if (left > Millis{0}) cv_.wait_for(lock, left);
    if (live_stop_) break;
    if (auto due = verdict_.suspect_due()) {
      Status v = *due;
      lock.unlock();
      PP_ERROR("{}", v.message());
      decide(v, true);
      lock.lock();
      continue;
    }
    if (live_.detect && !verdict_.failure()) {
      if (auto expired = silence_->first_expired()) {
        Status v(ErrorCode::kPeerFailure,
                 fmt::format("collective: {} failed: no heartbeat for {} ms (limit {} ms); it is "
                             "stopped, hung or unreachable",
                             describe(expired->first), expired->second.count(),
                             live_.heartbeat_timeout.count()));
        lock.unlock();
        PP_ERROR("{}", v.message());
        decide(v, true);
        lock.lock();
        continue;
      }
    }
    if (Real::now() < next_beat) continue;
    next_beat = Real::now() + live_.heartbeat_interval;
    std::vector<net::ConnId> peers;
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && conns_[static_cast<size_t>(r)] && !dead_[static_cast<size_t>(r)])
        peers.push_back(conns_[static_cast<size_t>(r)]);
    lock.unlock();
    for (net::ConnId c : peers)
      net_.send_copy(c, net::Header{.type = kHeartbeatType}, nullptr, 0, kUrgentPriority);
    lock.lock();
  }
}

void VerdictPort::deliver(const Status& verdict) {
  std::lock_guard lock(mu_);
  if (target_) target_->declare(verdict);
}

}  // namespace pushpull::collective
