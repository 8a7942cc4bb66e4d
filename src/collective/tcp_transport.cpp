#include "collective/tcp_transport.h"

#include <sys/socket.h>

#include <cstring>

#include <fmt/ranges.h>

#include <fmt/format.h>

namespace pushpull::collective {
namespace {

constexpr uint16_t kDataType = net::msg::kCollectiveFirst;

net::TransportConfig config_of(int rank, const NetOptions& net) {
  net::TransportConfig c;
  c.net = net;
  c.role = Role::kWorker;
  c.rank = rank;
  c.label = fmt::format("collective rank {}", rank);
  return c;
}

}  // namespace

TcpTransport::TcpTransport(int rank, int size, const NetOptions& net, const std::string& host,
                           int port)
    : rank_(rank),
      size_(size),
      opts_(net),
      net_(config_of(rank, net)),
      conns_(static_cast<size_t>(size), 0),
      dead_(static_cast<size_t>(size)),
      host_(host) {
  if (size < 1 || rank < 0 || rank >= size)
    throw InvalidArgument(fmt::format("TcpTransport: rank {} of size {}", rank, size));
  net_.listen(host, port);
  net_.set_handler(kDataType, kDataType, [this](net::Message&& m) { on_message(std::move(m)); });
  net_.set_connect_handler([this](net::ConnId id, const net::PeerInfo& p) {
    {
      std::lock_guard lock(mu_);
      if (p.rank < 0 || p.rank >= size_) return;
      conns_[static_cast<size_t>(p.rank)] = id;
      rank_of_[id] = p.rank;
    }
    cv_.notify_all();
  });
  net_.set_close_handler(
      [this](net::ConnId id, const net::PeerInfo&, const Status& st) { on_close(id, st); });
  net_.start();
}

TcpTransport::~TcpTransport() {
  close(Status(ErrorCode::kPeerFailure, fmt::format("rank {} closed its transport", rank_)));
}

void TcpTransport::connect_all(const std::vector<std::pair<std::string, int>>& book) {
  if (static_cast<int>(book.size()) != size_)
    throw InvalidArgument(
        fmt::format("TcpTransport: address book of {} for size {}", book.size(), size_));
  for (int r = 0; r < rank_; ++r) {
    net::ConnId id =
        net_.connect(book[static_cast<size_t>(r)].first, book[static_cast<size_t>(r)].second);
    std::lock_guard lock(mu_);
    conns_[static_cast<size_t>(r)] = id;
    rank_of_[id] = r;
  }
  std::unique_lock lock(mu_);
  auto all = [&] {
    for (int r = rank_ + 1; r < size_; ++r)
      if (!conns_[static_cast<size_t>(r)]) return false;
    return true;
  };
  if (!cv_.wait_for(lock, opts_.connect_timeout, all)) {
    std::vector<int> missing;
    for (int r = rank_ + 1; r < size_; ++r)
      if (!conns_[static_cast<size_t>(r)]) missing.push_back(r);
    throw Timeout(fmt::format(
        "collective: rank {} waited {} ms for ranks {} to connect; check that they started and "
        "can reach {}:{}",
        rank_, opts_.connect_timeout.count(), fmt::join(missing, ", "), book[rank_].first,
        book[rank_].second));
  }
  lock.unlock();
  setup_streams(book);
}

Status TcpTransport::peer_error(int peer, const Status& why) const {
  return Status(ErrorCode::kPeerFailure,
                fmt::format("collective: rank {} is gone ({})", peer, why.message()));
}

void TcpTransport::post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                             Completion done) {
  net::ConnId conn;
  {
    std::lock_guard lock(mu_);
    Status err;
    if (closed_)
      err = *closed_;
    else if (peer < 0 || peer >= size_ || !conns_[static_cast<size_t>(peer)])
      err = Status(ErrorCode::kInvalidArgument,
                   fmt::format("collective: no connection to rank {}", peer));
    else if (dead_[static_cast<size_t>(peer)])
      err = peer_error(peer, *dead_[static_cast<size_t>(peer)]);
    if (!err.is_ok()) {
      done(err);
      return;
    }
    conn = conns_[static_cast<size_t>(peer)];
  }
  net::Header h;
  h.type = kDataType;
  h.request_id = tag;
  net_.send(conn, h, data, bytes, [this, peer, done = std::move(done)](const Status& st) {
    done(st.is_ok() ? st : peer_error(peer, st));
  });
}

void TcpTransport::post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) {
  Key key{peer, tag};
  net::ConnId conn;
  {
    std::unique_lock lock(mu_);
    Status err;
    if (closed_)
      err = *closed_;
    else if (peer < 0 || peer >= size_ || !conns_[static_cast<size_t>(peer)])
      err = Status(ErrorCode::kInvalidArgument,
                   fmt::format("collective: no connection to rank {}", peer));
    auto it = early_.find(key);
    if (err.is_ok() && it != early_.end()) {
      net::Buffer b = std::move(it->second.front());
      it->second.pop_front();
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
    if (err.is_ok() && dead_[static_cast<size_t>(peer)])
      err = peer_error(peer, *dead_[static_cast<size_t>(peer)]);
    if (!err.is_ok()) {
      lock.unlock();
      done(err);
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
  net::RecvMatch match{kDataType, tag, 0};
  Status st = net_.post_recv(
      conn, match, dst, bytes,
      [this, key](const Status& s, const net::Header& h) { on_net_recv(key, s, h); });
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
  if (failed) failed->done(peer_error(peer, st));
}

void TcpTransport::on_message(net::Message&& m) {
  // A message can beat connect_all's bookkeeping of an outgoing connection
  // (the peer sends as soon as its own connect_all is done): the hello
  // already told net who is at the other end, so register it from there.
  std::optional<net::PeerInfo> info;
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
  Key key{r->second, m.header.request_id};
  auto it = posted_.find(key);
  if (it == posted_.end()) {
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
  if (cancel) net_.cancel_recv(m.conn, net::RecvMatch{kDataType, key.second, 0});
  if (m.payload.size() != p.bytes) {
    p.done(Status(ErrorCode::kProtocolError,
                  fmt::format("collective: {} bytes from rank {} for a receive of {}",
                              m.payload.size(), key.first, p.bytes)));
    return;
  }
  if (p.bytes) std::memcpy(p.dst, m.payload.data(), p.bytes);
  p.done(Status::ok());
}

void TcpTransport::on_net_recv(Key key, const Status& st, const net::Header& h) {
  std::optional<Posted> p;
  {
    std::lock_guard lock(mu_);
    registered_.erase(key);
    auto it = posted_.find(key);
    if (it == posted_.end()) return;  // already failed or served
    p = std::move(it->second);
    posted_.erase(it);
  }
  if (!st.is_ok()) return p->done(peer_error(key.first, st));
  if (h.payload_bytes != p->bytes)
    return p->done(Status(ErrorCode::kProtocolError,
                          fmt::format("collective: {} bytes from rank {} for a receive of {}",
                                      h.payload_bytes, key.first, p->bytes)));
  p->done(Status::ok());
}

void TcpTransport::on_close(net::ConnId id, const Status& st) {
  std::vector<Posted> failed;
  int peer;
  {
    std::lock_guard lock(mu_);
    auto r = rank_of_.find(id);
    if (r == rank_of_.end()) return;
    peer = r->second;
    dead_[static_cast<size_t>(peer)] = st;
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
    p.done(peer_error(peer, st));
}

void TcpTransport::close(const Status& reason) {
  std::vector<Posted> failed;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = reason;
    for (auto& [k, p] : posted_)
      failed.push_back(std::move(p));
    posted_.clear();
  }
  for (auto& p : failed)
    p.done(reason);
  // Wakes a thread blocked on the streams (it then reports `reason`) and
  // makes the peers' stream reads end: they see this rank as gone.
  if (streams_ready_)
    for (auto& fd : streams_)
      if (fd.valid()) ::shutdown(fd.get(), SHUT_RDWR);
  net_.stop();
}

bool TcpTransport::is_closed() const {
  std::lock_guard lock(mu_);
  return closed_.has_value();
}

int TcpTransport::stream_fd(int peer) const {
  if (!streams_ready_ || peer < 0 || peer >= size_) return -1;
  return streams_[static_cast<size_t>(peer)].get();
}

Status TcpTransport::stream_error(int peer, const std::string& why, ErrorCode code) const {
  {
    std::lock_guard lock(mu_);
    if (closed_) return *closed_;
  }
  if (code == ErrorCode::kPeerFailure)
    return Status(code, fmt::format("collective: rank {} is gone ({})", peer, why));
  return Status(code, fmt::format("collective: data stream from rank {}: {}", peer, why));
}

}  // namespace pushpull::collective
