// SPDX-License-Identifier: Apache-2.0
// TcpTransport's connections (see tcp_transport.h): the start-up partners
// (mesh_partners) dialed in parallel by connect_all, and every other pair
// connected lazily on first use: operations queued per peer in order, the
// higher rank dialing (a few dialer threads), the lower one asking it to
// over the partner links (kDialMeType), a deadline on both.
#include <algorithm>
#include <exception>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pushpull/log.h"
#include "transport/address.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/wire.h"

namespace pushpull::transport {
namespace {

// At most this many start-up dials at once (each one a thread).
constexpr int kStartupDialers = 16;
// A lower rank waiting for a lazy connection asks the higher one this often.
constexpr Millis kAskAgain{1000};

}  // namespace

void TcpTransport::connect_all(const std::vector<std::pair<std::string, int>>& book) {
  if (static_cast<int>(book.size()) != size_)
    throw InvalidArgument(
        fmt::format("TcpTransport: address book of {} for size {}", book.size(), size_));
  std::vector<std::string> hosts;
  for (int r = 0; r < size_; ++r) {
    where_[static_cast<size_t>(r)] = transport::format_address(book[static_cast<size_t>(r)].first,
                                                               book[static_cast<size_t>(r)].second);
    hosts.push_back(book[static_cast<size_t>(r)].first);
  }
  const std::vector<int> partners = mesh_partners(rank_, hosts);
  std::vector<int> lower, higher;
  for (int p : partners)
    (p < rank_ ? lower : higher).push_back(p);
  {
    std::lock_guard lock(mu_);
    book_ = book;
    // The start-up dials below are these pairs' only ones: a lazy request
    // (a partner's "dial me") must not open a second connection.
    for (int p : lower)
      dialing_[static_cast<size_t>(p)] = 1;
    // Asked to dial before this rank knew the book (a partner forwarded it).
    for (int asker : early_dial_me_)
      if (!conns_[static_cast<size_t>(asker)] && !dialing_[static_cast<size_t>(asker)])
        request_connection(asker);
    early_dial_me_.clear();
  }
  const auto deadline = Clock::now() + opts_.connect_timeout;
  // The lower partners, dialed in parallel; the higher ones dial this rank.
  std::mutex dial_mu;
  size_t next = 0;
  std::exception_ptr first_error;
  bool stop = false;  // under dial_mu: the wait ended (a verdict)
  std::vector<std::thread> dialers;
  const int threads = std::min<int>(kStartupDialers, static_cast<int>(lower.size()));
  for (int i = 0; i < threads; ++i)
    dialers.emplace_back([&] {
      for (;;) {
        int p;
        {
          std::lock_guard lock(dial_mu);
          if (next >= lower.size() || first_error || stop) return;
          p = lower[next++];
        }
        try {
          auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
          transport::ConnId id =
              net_.connect(book[static_cast<size_t>(p)].first, book[static_cast<size_t>(p)].second,
                           std::max(left, Millis{1}));
          {
            std::lock_guard lock(mu_);
            conns_[static_cast<size_t>(p)] = id;
            rank_of_[id] = p;
            dialing_[static_cast<size_t>(p)] = 0;
          }
          flush(p);  // nothing, unless an operation was posted meanwhile
        } catch (...) {
          std::lock_guard lock(dial_mu);
          if (!first_error) first_error = std::current_exception();
        }
        cv_.notify_all();
      }
    });
  std::unique_lock lock(mu_);
  auto all = [&] {
    for (int r : higher)
      if (!conns_[static_cast<size_t>(r)]) return false;
    return true;
  };
  // A verdict delivered meanwhile (an elastic round whose member died before
  // connecting: VerdictPort) ends the wait at once instead of at the timeout.
  const bool connected = cv_.wait_until(lock, deadline, [&] {
    std::lock_guard dl(dial_mu);
    return all() || detector_.verdict().failure().has_value() || first_error;
  });
  const std::optional<Status> failure = detector_.verdict().failure();
  lock.unlock();
  if (failure) {
    std::lock_guard dl(dial_mu);
    stop = true;  // the dials not started yet are of no use
  }
  for (auto& t : dialers)
    t.join();
  if (failure && !all())
    throw PeerFailure(
        fmt::format("collective: rank {} stopped waiting for its peers to connect: {}", rank_,
                    failure->message()));
  if (first_error) std::rethrow_exception(first_error);
  if (!connected) {
    std::vector<int> missing;
    lock.lock();
    for (int r : higher)
      if (!conns_[static_cast<size_t>(r)]) missing.push_back(r);
    lock.unlock();
    throw Timeout(fmt::format(
        "collective: rank {} waited {} ms for ranks {} to connect; check that they started and "
        "can reach {}:{}",
        rank_, opts_.connect_timeout.count(), fmt::join(missing, ", "), book[rank_].first,
        book[rank_].second));
  }
  setup_streams(book, partners);
  PP_INFO("collective rank {}: connected to {} of {} peers at start-up (the others on first use)",
          rank_, partners.size(), size_ - 1);
}

int TcpTransport::connected_peers() const {
  std::lock_guard lock(mu_);
  int n = 0;
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && conns_[static_cast<size_t>(r)] && !dead_[static_cast<size_t>(r)]) ++n;
  return n;
}

Millis TcpTransport::lazy_timeout() const {
  return std::min(opts_.connect_timeout, live_.heartbeat_timeout + Millis{2000});
}

bool TcpTransport::defer(int peer, Deferred& d) {
  const auto p = static_cast<size_t>(peer);
  if (conns_[p] && deferred_[p].empty() && !flushing_[p]) return false;
  deferred_[p].push_back(std::move(d));
  if (!conns_[p]) request_connection(peer);
  return true;
}

void TcpTransport::request_connection(int peer) {
  const auto p = static_cast<size_t>(peer);
  if (peer > rank_) {
    // The lower rank waits for the higher to dial, and asks it to.
    if (wait_until_[p]) return;
    asked_[p] = Clock::now();
    wait_until_[p] = asked_[p] + lazy_timeout();
  } else {
    if (dialing_[p]) return;
    dialing_[p] = 1;
  }
  dial_queue_.push_back(peer);
  while (static_cast<int>(dialers_.size()) < kLazyDialers)
    dialers_.emplace_back([this] {
      ScopedLogContext ctx(fmt::format("collective rank {} dialer", rank_));
      lazy_loop();
    });
  lazy_cv_.notify_one();
}

void TcpTransport::lazy_loop() {
  std::unique_lock lock(mu_);
  while (!lazy_stop_) {
    // A lower-side wait that ran out: the peer never dialed.
    auto now = Clock::now();
    auto wake = Clock::time_point::max();
    int expired = -1;
    for (int r = 0; r < size_ && expired < 0; ++r) {
      auto& w = wait_until_[static_cast<size_t>(r)];
      if (!w) continue;
      if (conns_[static_cast<size_t>(r)]) {
        w.reset();
      } else if (now >= *w) {
        w.reset();
        expired = r;
      } else {
        // Asked again every second: a forwarder may not have had its links yet.
        auto& asked = asked_[static_cast<size_t>(r)];
        if (now >= asked + kAskAgain) {
          asked = now;
          dial_queue_.push_back(r);
        }
        wake = std::min({wake, *w, asked + kAskAgain});
      }
    }
    if (expired >= 0) {
      Status why(ErrorCode::kIoError, fmt::format("it did not connect within {} ms when asked to",
                                                  lazy_timeout().count()));
      lock.unlock();
      lazy_failed(expired, std::move(why));
      lock.lock();
      continue;
    }
    if (dial_queue_.empty()) {
      if (wake == Clock::time_point::max())
        lazy_cv_.wait(lock);
      else
        lazy_cv_.wait_until(lock, wake);
      continue;
    }
    const int peer = dial_queue_.front();
    dial_queue_.pop_front();
    lock.unlock();
    if (peer < rank_)
      dial(peer);
    else
      send_dial_me(rank_, peer);
    lock.lock();
  }
}

void TcpTransport::dial(int peer) {
  std::pair<std::string, int> where;
  Millis limit;
  {
    std::lock_guard lock(mu_);
    if (conns_[static_cast<size_t>(peer)] || closed_) {
      dialing_[static_cast<size_t>(peer)] = 0;
      return;
    }
    where = book_[static_cast<size_t>(peer)];
    limit = lazy_timeout();
  }
  transport::ConnId id = 0;
  try {
    id = net_.connect(where.first, where.second, limit);
  } catch (const Error& e) {
    {
      std::lock_guard lock(mu_);
      dialing_[static_cast<size_t>(peer)] = 0;
    }
    return lazy_failed(peer, Status(e.code(), e.what()));
  }
  {
    std::lock_guard lock(mu_);
    dialing_[static_cast<size_t>(peer)] = 0;
    if (!conns_[static_cast<size_t>(peer)]) {
      conns_[static_cast<size_t>(peer)] = id;
      rank_of_[id] = peer;
    }
  }
  cv_.notify_all();
  flush(peer);
}

void TcpTransport::lazy_failed(int peer, Status why) {
  std::vector<Deferred> failed;
  {
    std::lock_guard lock(mu_);
    const auto p = static_cast<size_t>(peer);
    if (!dead_[p]) dead_[p] = why;
    if (live_thread_.joinable() && !closed_ && !left_[p])
      detector_.verdict().suspect(peer_error(peer, why), live_.grace);
    while (!deferred_[p].empty()) {
      failed.push_back(std::move(deferred_[p].front()));
      deferred_[p].pop_front();
    }
  }
  cv_.notify_all();
  PP_WARN("collective: cannot connect {}: {}", describe(peer), why.message());
  for (auto& d : failed)
    fail_or_hold(peer, std::move(d.done), why);
}

void TcpTransport::flush(int peer) {
  const auto p = static_cast<size_t>(peer);
  std::unique_lock lock(mu_);
  if (flushing_[p]) return;  // the thread flushing now runs what was added too
  flushing_[p] = 1;
  while (!deferred_[p].empty()) {
    std::deque<Deferred> batch;
    batch.swap(deferred_[p]);
    lock.unlock();
    for (auto& d : batch) {
      if (d.send)
        post_send_now(peer, d.tag, d.src, d.bytes, std::move(d.done), true);
      else
        post_recv_now(peer, d.tag, d.dst, d.bytes, std::move(d.done), true);
    }
    lock.lock();
  }
  flushing_[p] = 0;
}

std::vector<TcpTransport::Deferred> TcpTransport::take_deferred() {
  std::vector<Deferred> out;
  for (auto& q : deferred_) {
    for (auto& d : q)
      out.push_back(std::move(d));
    q.clear();
  }
  for (auto& w : wait_until_)
    w.reset();
  return out;
}

void TcpTransport::send_dial_me(int from, int to) {
  transport::ConnId via = 0;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    if (from == rank_ && conns_[static_cast<size_t>(to)]) return;  // connected meanwhile
    const int d = (to - rank_ + size_) % size_;
    int step = 1;
    while (step * 2 <= d)
      step *= 2;
    // rank_ + step is a partner (2^k away), so the route has O(log n) hops.
    const auto hop = static_cast<size_t>((rank_ + step) % size_);
    if (!dead_[hop]) via = conns_[hop];
  }
  if (via == 0) return;  // the lower side's wait fails at its deadline
  std::byte payload[8];
  transport::store_le<uint32_t>(payload, static_cast<uint32_t>(from));
  transport::store_le<uint32_t>(payload + 4, static_cast<uint32_t>(to));
  net_.send_copy(via, transport::Header{.type = kDialMeType}, payload, sizeof payload,
                 kUrgentPriority);
}

void TcpTransport::on_dial_me(const transport::Message& m, int from) {
  if (from < 0 || m.payload.size() != 8) return;  // malformed: ignored
  const uint32_t a = transport::load_le<uint32_t>(m.payload.data()),
                 b = transport::load_le<uint32_t>(m.payload.data() + 4);
  if (a >= static_cast<uint32_t>(size_) || b >= static_cast<uint32_t>(size_) || a >= b) return;
  const int asker = static_cast<int>(a), target = static_cast<int>(b);
  if (target != rank_) return send_dial_me(asker, target);  // forward
  std::lock_guard lock(mu_);
  const auto p = static_cast<size_t>(asker);
  if (closed_ || conns_[p] || dialing_[p] || dead_[p]) return;
  if (book_.empty()) {
    if (early_dial_me_.size() < static_cast<size_t>(size_)) early_dial_me_.push_back(asker);
    return;
  }
  request_connection(asker);
}

}  // namespace pushpull::transport
