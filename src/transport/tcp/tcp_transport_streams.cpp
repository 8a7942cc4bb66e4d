// SPDX-License-Identifier: Apache-2.0
// TcpTransport::setup_streams: opens the direct data streams (tcp_streams.h)
// after the net connections are up; and the streams' accessors.
//
// Only the mesh partners get a stream (tcp_transport.h). The higher rank of
// each pair opens it to the lower one's net listening port with the one
// hello of every connection, marked as a stream (transport::MessageTransport::
// open_stream: the same proofs, TLS, stranger handling and local-only rule);
// the lower rank's MessageTransport accepts it on its I/O thread, whatever
// this thread is doing, and queues it for take_stream(). So "open to the
// lower ranks, then take the higher ones" cannot deadlock and a stranger's
// silent connection cannot stall it. Everything is bounded by
// NetOptions::connect_timeout; a verdict (a peer that died before opening
// its stream) ends the wait at once.
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "transport/tcp/tcp_transport.h"

namespace pushpull::transport {
namespace {

// How often a rank waiting for its streams looks at the verdict.
constexpr Millis kVerdictCheck{100};

}  // namespace

void TcpTransport::setup_streams(const std::vector<std::pair<std::string, int>>& book,
                                 const std::vector<int>& partners) {
  const auto deadline = Clock::now() + opts_.connect_timeout;
  std::vector<transport::Stream> got(static_cast<size_t>(size_));
  // Open a stream to every lower partner (it proves it is that rank).
  for (int p : partners) {
    if (p > rank_) break;
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    const auto& where = book[static_cast<size_t>(p)];
    got[static_cast<size_t>(p)] =
        net_.open_stream(where.first, where.second, Role::kWorker, p, std::max(left, Millis{1}));
  }
  // Take every higher partner's.
  for (int q : partners) {
    if (q < rank_) continue;
    for (;;) {
      const auto slice = std::min(deadline, Clock::now() + kVerdictCheck);
      Status st = net_.take_stream(Role::kWorker, q, slice, &got[static_cast<size_t>(q)]);
      if (st.is_ok()) break;
      if (st.code() != ErrorCode::kTimeout) st.raise();
      {
        std::lock_guard lock(mu_);
        if (auto failure = detector_.verdict().failure())
          throw PeerFailure(
              fmt::format("collective rank {}: stopped waiting for its data streams: {}", rank_,
                          failure->message()));
      }
      if (Clock::now() < deadline) continue;
      std::vector<int> missing;
      for (int r : partners)
        if (r > rank_ && !got[static_cast<size_t>(r)].fd.valid()) missing.push_back(r);
      throw Timeout(fmt::format(
          "collective rank {}: data streams: rank(s) {} opened none within {} ms; check that "
          "they started and can reach {}:{}",
          rank_, fmt::join(missing, ", "), opts_.connect_timeout.count(),
          book[static_cast<size_t>(rank_)].first, book[static_cast<size_t>(rank_)].second));
    }
  }
  std::vector<transport::Fd> sockets(got.size());
  std::vector<std::unique_ptr<transport::TlsLink>> links(got.size());
  bool tls = false;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i].fd.valid()) continue;
    transport::set_nonblocking(got[i].fd.get(), true);
    // TCP_NODELAY only: fixed SO_SNDBUF/SO_RCVBUF would switch off the
    // kernel's buffer autotuning, measured 20% slower on loopback.
    transport::tune_socket(got[i].fd.get(), 0);
    sockets[i] = std::move(got[i].fd);
    tls = tls || got[i].tls != nullptr;
    links[i] = std::move(got[i].tls);
  }
  streams_ = std::move(sockets);
  if (tls) stream_tls_ = std::move(links);
  streams_ready_ = true;
}

void TcpTransport::run(const Schedule& s) {
  if (streams_ready_)
    run_on_streams(streams_api_, s);
  else
    run_posted(*this, s);
}

bool TcpTransport::is_closed() const {
  std::lock_guard lock(mu_);
  return closed_.has_value() || detector_.verdict().failure().has_value();
}

int TcpTransport::stream_fd(int peer) const {
  if (!streams_ready_ || peer < 0 || peer >= size_) return -1;
  return streams_[static_cast<size_t>(peer)].get();
}

transport::TlsLink* TcpTransport::stream_tls(int peer) const {
  if (!streams_ready_ || peer < 0 || peer >= size_ || stream_tls_.empty()) return nullptr;
  return stream_tls_[static_cast<size_t>(peer)].get();
}

Status TcpTransport::stream_error(int peer, const std::string& why, ErrorCode code) {
  std::unique_lock lock(mu_);
  if (closed_) return *closed_;
  if (detector_.verdict().failure()) return *detector_.verdict().failure();
  if (code != ErrorCode::kPeerFailure || peer < 0 || peer >= size_)
    return Status(code, fmt::format("collective: data stream from {}: {}", describe(peer), why));
  Status blame = peer_error(peer, Status(ErrorCode::kIoError, why));
  if (!live_thread_.joinable()) return blame;
  // The peer may be closing because another node failed first: give that
  // verdict the grace to arrive (the liveness thread settles the suspect).
  detector_.verdict().suspect(blame, live_.grace);
  cv_.notify_all();
  cv_.wait_for(lock, live_.grace + Millis{1000},
               [&] { return closed_.has_value() || detector_.verdict().failure().has_value(); });
  if (closed_) return *closed_;
  if (detector_.verdict().failure()) return *detector_.verdict().failure();
  return blame;
}

}  // namespace pushpull::transport
