// SPDX-License-Identifier: Apache-2.0
#include "transport/tcp/tcp_transport.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include <fmt/ranges.h>

#include <fmt/format.h>

#include "pushpull/log.h"
#include "transport/address.h"
#include "transport/inproc/in_process_listeners.h"

namespace pushpull::transport {
namespace {

transport::TransportConfig config_of(int rank, int size, const NetOptions& net) {
  transport::TransportConfig c;
  c.net = net;
  c.role = Role::kWorker;
  c.rank = rank;
  c.label = fmt::format("collective rank {}", rank);
  c.stream_ranks = size;  // the group's ranks open their data streams here
  return c;
}

}  // namespace

TcpTransport::TcpTransport(int rank, int size, const NetOptions& net, const std::string& host,
                           int port)
    : TcpTransport(rank, size, net, host,
                   transport::is_in_process_host(host) ? transport::Fd()
                                                       : transport::listen_on(host, port)) {}

TcpTransport::TcpTransport(int rank, int size, const NetOptions& net, const std::string& host,
                           transport::Fd listener)
    : rank_(rank),
      size_(size),
      opts_(net),
      net_(config_of(rank, size, net)),
      conns_(static_cast<size_t>(size), 0),
      dead_(static_cast<size_t>(size)),
      early_count_(static_cast<size_t>(size), 0),
      early_bytes_(static_cast<size_t>(size), 0),
      where_(static_cast<size_t>(size)),
      left_(static_cast<size_t>(size), false),
      deferred_(static_cast<size_t>(size)),
      flushing_(static_cast<size_t>(size), 0),
      dialing_(static_cast<size_t>(size), 0),
      wait_until_(static_cast<size_t>(size)),
      asked_(static_cast<size_t>(size)) {
  if (size < 1 || rank < 0 || rank >= size)
    throw InvalidArgument(fmt::format("TcpTransport: rank {} of size {}", rank, size));
  if (!listener.valid() && transport::is_in_process_host(host))
    net_.listen(host, 0);  // the in-process medium (tests): no socket
  else
    net_.listen(std::move(listener));
  net_.set_handler(kDataType, kDataType,
                   [this](transport::Message&& m) { on_message(std::move(m)); });
  net_.set_handler(kHeartbeatType, kDialMeType,
                   [this](transport::Message&& m) { on_control(std::move(m)); });
  port_->target_ = this;
  net_.set_connect_handler([this](transport::ConnId id, const transport::PeerInfo& p) {
    {
      std::lock_guard lock(mu_);
      if (p.rank < 0 || p.rank >= size_) return;
      conns_[static_cast<size_t>(p.rank)] = id;
      rank_of_[id] = p.rank;
      wait_until_[static_cast<size_t>(p.rank)].reset();
    }
    cv_.notify_all();
    flush(p.rank);  // operations that waited for this (lazy) connection
  });
  net_.set_close_handler([this](transport::ConnId id, const transport::PeerInfo&,
                                const Status& st) { on_close(id, st); });
  net_.start();
}

TcpTransport::~TcpTransport() {
  {
    // Waits for a verdict being delivered through the port, then cuts it off.
    std::lock_guard lock(port_->mu_);
    port_->target_ = nullptr;
  }
  close(Status(ErrorCode::kPeerFailure, fmt::format("rank {} closed its transport", rank_)));
}

void TcpTransport::post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                             Completion done) {
  post_send_now(peer, tag, data, bytes, std::move(done), false);
}

Status TcpTransport::refusal_locked(int peer) const {
  if (closed_) return *closed_;
  if (detector_.verdict().failure()) return *detector_.verdict().failure();
  if (peer < 0 || peer >= size_ || peer == rank_ || book_.empty())
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("collective: no connection to rank {}", peer));
  return Status::ok();
}

void TcpTransport::post_send_now(int peer, uint64_t tag, const void* data, size_t bytes,
                                 Completion done, bool flushing) {
  transport::ConnId conn;
  std::optional<Status> dead;
  {
    std::unique_lock lock(mu_);
    if (Status err = refusal_locked(peer); !err.is_ok()) {
      lock.unlock();  // completions never run under the transport's lock
      done(err);
      return;
    }
    dead = dead_[static_cast<size_t>(peer)];
    if (!dead && !flushing) {
      Deferred d{true, tag, data, nullptr, bytes, std::move(done)};
      if (defer(peer, d)) return;
      done = std::move(d.done);
    }
    conn = conns_[static_cast<size_t>(peer)];
  }
  if (dead) return fail_or_hold(peer, std::move(done), *dead);
  transport::Header h;
  h.type = kDataType;
  h.request_id = tag;
  net_.send(conn, h, data, bytes, [this, peer, done = std::move(done)](const Status& st) mutable {
    if (st.is_ok()) return done(st);
    fail_or_hold(peer, std::move(done), st);
  });
}

void TcpTransport::post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) {
  post_recv_now(peer, tag, dst, bytes, std::move(done), false);
}

void TcpTransport::post_recv_now(int peer, uint64_t tag, void* dst, size_t bytes, Completion done,
                                 bool flushing) {
  Key key{peer, tag};
  transport::ConnId conn;
  {
    std::unique_lock lock(mu_);
    Status err = refusal_locked(peer);
    if (err.is_ok() && !flushing && !dead_[static_cast<size_t>(peer)]) {
      Deferred d{false, tag, nullptr, dst, bytes, std::move(done)};
      if (defer(peer, d)) return;
      done = std::move(d.done);
    }
    auto it = early_.find(key);
    if (err.is_ok() && it != early_.end()) {
      transport::Buffer b = std::move(it->second.front());
      it->second.pop_front();
      if (early_count_[static_cast<size_t>(peer)] != SIZE_MAX)
        --early_count_[static_cast<size_t>(peer)];
      early_bytes_[static_cast<size_t>(peer)] -= b.size();
      if (it->second.empty()) early_.erase(it);
      lock.unlock();
      if (b.size() != bytes) {
        done(Status(ErrorCode::kProtocolError,
                    fmt::format("collective: {} bytes from rank {} (tag {:#x}) for a receive of {}",
                                b.size(), peer, tag, bytes)));
        return;
      }
      if (bytes) std::memcpy(dst, b.data(), bytes);
      done(Status::ok());
      return;
    }
    if (!err.is_ok()) {
      lock.unlock();
      done(err);
      return;
    }
    if (dead_[static_cast<size_t>(peer)]) {
      Status why = *dead_[static_cast<size_t>(peer)];
      lock.unlock();
      fail_or_hold(peer, std::move(done), why);
      return;
    }
    if (!posted_.emplace(key, Posted{dst, bytes, std::move(done)}).second) {
      lock.unlock();
      throw Internal(
          fmt::format("collective: receive from rank {} tag {:#x} posted twice", peer, tag));
    }
    conn = conns_[static_cast<size_t>(peer)];
  }
  if (tag & kControlTagBit) return;  // control: served by on_message (copy)
  transport::RecvMatch match{kDataType, tag, 0};
  Status st = net_.post_recv(
      conn, match, dst, bytes,
      [this, key](const Status& s, const transport::Header& h) { on_net_recv(key, s, h); });
  std::optional<Posted> failed;
  {
    std::lock_guard lock(mu_);
    if (claimed_.erase(key)) {
      // on_message got the payload before net saw the posting: withdraw it.
      if (st.is_ok()) net_.cancel_recv(conn, match);
    } else if (!st.is_ok()) {
      auto it = posted_.find(key);
      if (it != posted_.end()) {
        failed = std::move(it->second);
        posted_.erase(it);
      }
    } else if (posted_.count(key)) {
      registered_.insert(key);
    }
  }
  if (failed) fail_or_hold(peer, std::move(failed->done), st);
}

void TcpTransport::on_message(transport::Message&& m) {
  // A message can beat connect_all's bookkeeping of an outgoing connection
  // (the peer sends as soon as its own connect_all is done): the hello
  // already told net who is at the other end, so register it from there.
  std::optional<transport::PeerInfo> info;
  bool known;
  {
    std::lock_guard lock(mu_);
    known = rank_of_.count(m.conn) > 0;
  }
  if (!known) info = net_.peer(m.conn);  // outside mu_: net takes its own lock
  std::unique_lock lock(mu_);
  if (info && info->rank >= 0 && info->rank < size_ && !rank_of_.count(m.conn)) {
    rank_of_[m.conn] = info->rank;
    conns_[static_cast<size_t>(info->rank)] = m.conn;
  }
  auto r = rank_of_.find(m.conn);
  if (r == rank_of_.end()) return;
  heard(m.conn);
  Key key{r->second, m.header.request_id};
  auto it = posted_.find(key);
  if (it == posted_.end()) {
    const auto p = static_cast<size_t>(key.first);
    if (early_count_[p] == SIZE_MAX) return;  // over the limit already; closing
    if (early_count_[p] + 1 > live_.early_messages ||
        early_bytes_[p] + m.payload.size() > live_.early_bytes) {
      // Nobody asked for these: a peer out of step or misbehaving. Bounded.
      Status bad(ErrorCode::kProtocolError,
                 fmt::format("collective: {} sent more than {} messages / {} bytes that no "
                             "receive asked for",
                             describe(key.first), live_.early_messages, live_.early_bytes));
      early_count_[p] = SIZE_MAX;
      lock.unlock();
      PP_ERROR("{}; closing its connection", bad.message());
      net_.close(m.conn, bad);
      return;
    }
    ++early_count_[p];
    early_bytes_[p] += m.payload.size();
    early_[key].push_back(std::move(m.payload));
    return;
  }
  Posted p = std::move(it->second);
  posted_.erase(it);
  bool cancel = false;
  if (!(key.second & kControlTagBit)) {
    // A data receive was posted but the message came here (it arrived first):
    // withdraw the net posting, now or, if not made yet, by the poster.
    if (registered_.erase(key))
      cancel = true;
    else
      claimed_.insert(key);
  }
  lock.unlock();
  if (cancel) net_.cancel_recv(m.conn, transport::RecvMatch{kDataType, key.second, 0});
  if (m.payload.size() != p.bytes) {
    p.done(Status(ErrorCode::kProtocolError,
                  fmt::format("collective: {} bytes from rank {} for a receive of {}",
                              m.payload.size(), key.first, p.bytes)));
    return;
  }
  if (p.bytes) std::memcpy(p.dst, m.payload.data(), p.bytes);
  p.done(Status::ok());
}

void TcpTransport::on_net_recv(Key key, const Status& st, const transport::Header& h) {
  std::optional<Posted> p;
  {
    std::lock_guard lock(mu_);
    registered_.erase(key);
    if (st.is_ok() && key.first == watched_ && !dead_[static_cast<size_t>(key.first)])
      detector_.heard(static_cast<transport::Liveness::Member>(key.first));
    auto it = posted_.find(key);
    if (it == posted_.end()) return;  // already failed or served
    p = std::move(it->second);
    posted_.erase(it);
  }
  if (!st.is_ok()) return fail_or_hold(key.first, std::move(p->done), st);
  if (h.payload_bytes != p->bytes)
    return p->done(Status(ErrorCode::kProtocolError,
                          fmt::format("collective: {} bytes from rank {} for a receive of {}",
                                      h.payload_bytes, key.first, p->bytes)));
  p->done(Status::ok());
}

void TcpTransport::on_close(transport::ConnId id, const Status& st) {
  std::vector<Posted> failed;
  int peer;
  {
    std::lock_guard lock(mu_);
    auto r = rank_of_.find(id);
    if (r == rank_of_.end()) return;
    peer = r->second;
    dead_[static_cast<size_t>(peer)] = st;
    detector_.forget(static_cast<transport::Liveness::Member>(peer));  // a suspect, not silent
    if (live_thread_.joinable() && !closed_ && !left_[static_cast<size_t>(peer)])
      detector_.verdict().suspect(peer_error(peer, st), live_.grace);
    cv_.notify_all();
    for (auto it = posted_.begin(); it != posted_.end();) {
      if (it->first.first == peer) {
        registered_.erase(it->first);
        failed.push_back(std::move(it->second));
        it = posted_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& p : failed)
    fail_or_hold(peer, std::move(p.done), st);
}

void TcpTransport::close(const Status& reason) {
  std::vector<Posted> failed;
  std::vector<transport::ConnId> bye;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    if (!detector_.verdict().failure())
      for (int r = 0; r < size_; ++r)
        if (r != rank_ && conns_[static_cast<size_t>(r)] && !dead_[static_cast<size_t>(r)])
          bye.push_back(conns_[static_cast<size_t>(r)]);
  }
  for (transport::ConnId c : bye)
    net_.send_copy(c, transport::Header{.type = kByeType}, nullptr, 0, kUrgentPriority);
  if (!bye.empty()) net_.drain(Millis{200});
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = reason;
    live_stop_ = true;
    for (auto& [k, p] : posted_)
      failed.push_back(std::move(p));
    posted_.clear();
    for (auto& done : held_)
      failed.push_back(Posted{nullptr, 0, std::move(done)});
    held_.clear();
    for (auto& d : take_deferred())
      failed.push_back(Posted{nullptr, 0, std::move(d.done)});
    lazy_stop_ = true;
  }
  cv_.notify_all();
  lazy_cv_.notify_all();
  if (live_thread_.joinable()) live_thread_.join();
  for (auto& p : failed)
    p.done(reason);
  // Wakes a thread blocked on the streams (it then reports `reason`) and
  // makes the peers' stream reads end: they see this rank as gone.
  if (streams_ready_)
    for (auto& fd : streams_)
      if (fd.valid()) ::shutdown(fd.get(), SHUT_RDWR);
  net_.stop();
  // A dial in progress ends at its (bounded) deadline; what it queued failed above.
  std::vector<std::thread> dialers;
  {
    std::lock_guard lock(mu_);
    dialers.swap(dialers_);
  }
  for (auto& t : dialers)
    t.join();
}

}  // namespace pushpull::transport
