// SPDX-License-Identifier: Apache-2.0
// TcpTransport's wiring of the shared failure detector (transport/
// liveness.h, see tcp_transport.h): the heartbeat to the ring predecessor,
// the indirect probe of the silent ring successor over the mesh, and the
// verdict that fails every operation and is told to (and passed on by)
// every peer.
#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "pushpull/log.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/wire.h"

namespace pushpull::transport {
namespace {

// A probe's payload: requester and target rank, u32 LE each.
constexpr size_t kProbeBytes = 8;

void put_probe(std::byte* out, int requester, int target) {
  transport::store_le<uint32_t>(out, static_cast<uint32_t>(requester));
  transport::store_le<uint32_t>(out + 4, static_cast<uint32_t>(target));
}

}  // namespace

Status TcpTransport::peer_error(int peer, const Status& why) const {
  if (left_[static_cast<size_t>(peer)])
    return Status(ErrorCode::kPeerFailure,
                  fmt::format("collective: {} has shut down its communicator ({})", describe(peer),
                              why.message()));
  return Status(ErrorCode::kPeerFailure,
                fmt::format("collective: {} failed: its connection was lost ({}); it crashed, was "
                            "killed or lost the network",
                            describe(peer), why.message()));
}

std::string TcpTransport::describe(int peer) const {
  // where_ and live_'s names are set up before any operation and never change.
  if (peer >= 0 && static_cast<size_t>(peer) < live_.names.size())
    return live_.names[static_cast<size_t>(peer)];
  if (peer < 0 || peer >= size_ || where_[static_cast<size_t>(peer)].empty())
    return fmt::format("{} {}", live_.noun, peer);
  return fmt::format("{} {} (host {})", live_.noun, peer, where_[static_cast<size_t>(peer)]);
}

void TcpTransport::fail_or_hold(int peer, Completion done, const Status& why) {
  std::unique_lock lock(mu_);
  Status now;
  if (closed_)
    now = *closed_;
  else if (detector_.verdict().failure())
    now = *detector_.verdict().failure();
  else if (!live_thread_.joinable() || left_[static_cast<size_t>(peer)])
    now = peer_error(peer, why);  // no detector to settle a suspect, or it left: at once
  if (!now.is_ok()) {
    lock.unlock();
    done(now);
    return;
  }
  detector_.verdict().suspect(peer_error(peer, why), live_.grace);
  held_.push_back(std::move(done));
  cv_.notify_all();
}

void TcpTransport::heard(transport::ConnId conn) {
  if (watched_ < 0) return;  // no detector: nothing to time (skips the lookup per message)
  int p = peer_of(conn);
  if (p >= 0 && p == watched_ && !dead_[static_cast<size_t>(p)])
    detector_.heard(static_cast<transport::Liveness::Member>(p));
}

int TcpTransport::peer_of(transport::ConnId conn) {
  auto r = rank_of_.find(conn);
  return r == rank_of_.end() ? -1 : r->second;
}

void TcpTransport::on_control(transport::Message&& m) {
  std::unique_lock lock(mu_);
  heard(m.conn);
  int from = peer_of(m.conn);
  if (m.header.type == kByeType && from >= 0) left_[static_cast<size_t>(from)] = true;
  if (m.header.type == kDialMeType) {
    lock.unlock();
    return on_dial_me(m, from);
  }
  if (m.header.type >= kProbeType && m.header.type <= kProbeAckType) {
    lock.unlock();
    return on_probe(std::move(m), from);
  }
  if (m.header.type != kVerdictType) return;  // a heartbeat: heard() is all
  if (from < 0 || m.payload.size() > kMaxVerdictBytes) return;
  std::string text(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
  lock.unlock();
  PP_DEBUG("collective: {} reports: {}", describe(from), text);
  // Passed on: the peers this rank reaches may not be connected to the sender.
  decide(Status(ErrorCode::kPeerFailure, std::move(text)), true);
}

void TcpTransport::on_probe(transport::Message&& m, int from) {
  if (from < 0 || m.payload.size() != kProbeBytes) return;  // malformed: ignored
  const uint32_t requester = transport::load_le<uint32_t>(m.payload.data()),
                 target = transport::load_le<uint32_t>(m.payload.data() + 4);
  if (requester >= static_cast<uint32_t>(size_) || target >= static_cast<uint32_t>(size_)) return;
  const int req = static_cast<int>(requester), tgt = static_cast<int>(target);
  transport::ConnId to = 0;
  uint16_t type = 0;
  {
    std::lock_guard lock(mu_);
    // Only a rank whose own detector runs is alive enough to answer or help.
    if (!live_thread_.joinable() || live_stop_ || closed_) return;
    auto live_conn = [&](int r) {
      return r != rank_ && !dead_[static_cast<size_t>(r)] ? conns_[static_cast<size_t>(r)] : 0;
    };
    if (m.header.type == kProbeType) {
      if (tgt != rank_) return;
      to = live_conn(from);  // the ack goes back to whoever probed
      type = kProbeAckType;
    } else if (m.header.type == kProbeReqType) {
      if (req != from || tgt == rank_) return;
      to = live_conn(tgt);  // probe the target for the requester
      type = kProbeType;
    } else if (req == rank_) {
      // An ack relayed for this rank's own probe: the target is alive.
      if (tgt == watched_ && !dead_[target]) detector_.heard(target);
      return;
    } else {
      if (from != tgt) return;  // a helper relays only the target's own ack
      to = live_conn(req);
      type = kProbeAckType;
    }
  }
  if (to != 0)
    net_.send_copy(to, transport::Header{.type = type}, m.payload.data(), kProbeBytes,
                   kUrgentPriority);
}

void TcpTransport::on_liveness(transport::Liveness::Event&& e, std::unique_lock<std::mutex>& lock) {
  using Event = transport::Liveness::Event;
  const int q = static_cast<int>(e.member);
  if (e.kind == Event::kSuspectDue || e.kind == Event::kDead) {
    Status v = e.why;
    if (e.kind == Event::kDead)
      v = Status(ErrorCode::kPeerFailure,
                 fmt::format("collective: {} failed: no heartbeat for {} ms (limit {} ms) and no "
                             "answer to probes; it is stopped, hung or unreachable",
                             describe(q), e.silence.count(), live_.heartbeat_timeout.count()));
    lock.unlock();
    PP_ERROR("{}", v.message());
    decide(v, true);
    lock.lock();
    return;
  }
  // A beat goes to the predecessor that watches this rank; the silent
  // successor's probe goes to it directly and through the helpers that hold
  // links to both ends.
  auto live_conn = [&](int r) {
    return r != rank_ && !dead_[static_cast<size_t>(r)] ? conns_[static_cast<size_t>(r)] : 0;
  };
  std::vector<std::pair<transport::ConnId, uint16_t>> sends;
  std::byte probe[kProbeBytes];
  if (e.kind == Event::kBeat) {
    if (transport::ConnId c = live_conn((rank_ - 1 + size_) % size_))
      sends.emplace_back(c, kHeartbeatType);
  } else if (e.kind == Event::kProbe) {
    PP_WARN("collective: {} silent for {} ms; probing it before declaring it failed", describe(q),
            e.silence.count());
    if (transport::ConnId c = live_conn(q)) sends.emplace_back(c, kProbeType);
    const int helpers[2] = {(q + 1) % size_, (rank_ - 1 + size_) % size_};
    for (int h : helpers)
      if (h != q && h != rank_ && (h != helpers[1] || helpers[1] != helpers[0]))
        if (transport::ConnId c = live_conn(h)) sends.emplace_back(c, kProbeReqType);
    put_probe(probe, rank_, q);
  }
  lock.unlock();
  for (const auto& [c, type] : sends) {
    const bool beat = type == kHeartbeatType;
    if (net_.send_copy(c, transport::Header{.type = type}, beat ? nullptr : probe,
                       beat ? 0 : kProbeBytes, kUrgentPriority)
            .is_ok() &&
        beat)
      heartbeats_sent_.fetch_add(1, std::memory_order_relaxed);
  }
  lock.lock();
}

void TcpTransport::decide(const Status& verdict, bool tell) {
  std::vector<Completion> failed;
  std::vector<transport::ConnId> peers;
  std::vector<std::pair<Key, transport::ConnId>> in_net;  // data receives net may be filling
  std::function<void(const Status&)> hook;
  {
    std::lock_guard lock(mu_);
    if (closed_ || !detector_.verdict().decide(verdict)) return;
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
    for (auto& d : take_deferred())
      failed.push_back(std::move(d.done));
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && conns_[static_cast<size_t>(r)] && !dead_[static_cast<size_t>(r)])
        peers.push_back(conns_[static_cast<size_t>(r)]);
  }
  cv_.notify_all();
  if (tell) {
    std::string text = verdict.message().substr(0, kMaxVerdictBytes);
    for (transport::ConnId c : peers)
      net_.send_copy(c, transport::Header{.type = kVerdictType}, text.data(), text.size(),
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
    if (!net_.cancel_recv(conn, transport::RecvMatch{kDataType, key.second, 0})) continue;
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
  return detector_.verdict().failure();
}

void TcpTransport::abort(const Status& why) {
  bool quiet;
  {
    // After a peer shut down in order the group is ending: an operation that
    // failed on that is no failure of the job (no verdict).
    std::lock_guard lock(mu_);
    quiet = why.code() == ErrorCode::kPeerFailure && !detector_.verdict().failure() &&
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
  Millis window = live_.probe_window;
  if (window <= Millis{0})
    window = std::clamp(2 * live_.heartbeat_interval, Millis{100}, Millis{1000});
  detector_ = transport::Liveness({live_.heartbeat_interval, live_.heartbeat_timeout, window},
                                  *live_.clock);
  // Without detection (another detector declares) nobody is timed: the
  // beats still go out, and closed connections are still suspects.
  watched_ = live_.detect && size_ > 1 ? (rank_ + 1) % size_ : -1;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (dead_[static_cast<size_t>(r)])
      detector_.verdict().suspect(peer_error(r, *dead_[static_cast<size_t>(r)]), live_.grace);
    else if (r == watched_)
      detector_.heard(static_cast<transport::Liveness::Member>(r));
  }
  live_thread_ = std::thread([this] {
    ScopedLogContext ctx(fmt::format("collective rank {} liveness", rank_));
    std::unique_lock lock(mu_);
    detector_.run(
        lock, cv_, [&] { return live_stop_; },
        [&](transport::Liveness::Event&& e) { on_liveness(std::move(e), lock); });
  });
}

void VerdictPort::deliver(const Status& verdict) {
  std::lock_guard lock(mu_);
  if (target_) target_->declare(verdict);
}

}  // namespace pushpull::transport
