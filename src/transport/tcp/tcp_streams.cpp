// SPDX-License-Identifier: Apache-2.0
#include "transport/tcp/tcp_streams.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace pushpull::transport {
namespace {

constexpr int kMaxIov = 64;
constexpr size_t kHdr = transport::kHeaderBytes;
// How long a waiting pump keeps yielding and re-checking before it blocks.
constexpr auto kYieldWindow = std::chrono::microseconds(100);

// sendmsg(2) / readv(2) on a non-blocking stream, through its TLS link when
// there is one (transport/tls.h: what sendv() took is committed and goes out with
// later calls or flush()).
ssize_t stream_writev(int fd, transport::TlsLink* tls, iovec* iov, int n) {
  if (tls != nullptr) return tls->sendv(iov, n);
  msghdr mh{};
  mh.msg_iov = iov;
  mh.msg_iovlen = static_cast<size_t>(n);
  return ::sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}
ssize_t stream_readv(int fd, transport::TlsLink* tls, iovec* iov, int n) {
  return tls != nullptr ? tls->readv(iov, n) : ::readv(fd, iov, n);
}
bool tls_pending(const transport::TlsLink* tls) {
  return tls != nullptr && tls->output_pending();
}
// The header of one stream message (tcp_streams.h, "Wire").
transport::HeaderBytes stream_header(uint64_t tag, size_t bytes) {
  return transport::encode_header(transport::Header{
      .type = transport::msg::kStreamData, .request_id = tag, .payload_bytes = bytes});
}

}  // namespace

StreamPump::StreamPump(DirectStreams& t, Millis progress_timeout, std::string what)
    : t_(t), timeout_(progress_timeout), what_(std::move(what)) {
  peers_.reserve(2);
}

StreamPump::Peer& StreamPump::peer(int p) {
  for (auto& x : peers_)
    if (x.peer == p) return x;
  int fd = t_.stream_fd(p);
  if (fd < 0)
    throw InvalidArgument(
        fmt::format("collective: rank {} has no data stream to rank {}", t_.rank(), p));
  peers_.push_back(Peer{p, fd, t_.stream_tls(p), {}, {}, 0});
  return peers_.back();
}

void StreamPump::send(int p, uint64_t tag, const void* data, size_t bytes) {
  Out o;
  o.hdr = stream_header(tag, bytes);
  o.data = static_cast<const char*>(data);
  o.bytes = bytes;
  peer(p).out.push_back(o);
}

size_t StreamPump::recv(int p, uint64_t tag, void* dst, size_t bytes) {
  Peer& x = peer(p);
  x.in.push_back(In{tag, static_cast<char*>(dst), bytes, {}, 0});
  return x.in.size() - 1;
}

void StreamPump::wait_recv(int p, size_t index, size_t read_ahead) {
  Peer& x = peer(p);
  progress(p, std::max(index, read_ahead), [&x, index] { return x.in_next > index; });
}

void StreamPump::finish() {
  progress(-1, SIZE_MAX, [this] {
    for (auto& x : peers_)
      if (!x.out.empty() || x.in_next < x.in.size() || tls_pending(x.tls)) return false;
    return true;
  });
}

void StreamPump::wait_sent() {
  progress(-2, 0, [this] {
    for (auto& x : peers_)
      if (!x.out.empty() || tls_pending(x.tls)) return false;
    return true;
  });
}

[[noreturn]] void StreamPump::fail(const Peer& p, int err, const char* op) const {
  std::string why = err == 0 ? std::string("the peer closed the stream")
                             : fmt::format("{} failed: {}", op, std::strerror(err));
  t_.stream_error(p.peer, why).raise();
  throw Internal("unreachable");  // raise() throws for a non-ok status
}

bool StreamPump::write_some(Peer& p) {
  bool moved = false;
  if (tls_pending(p.tls)) {
    int f = p.tls->flush();
    if (f < 0) fail(p, errno, "send");
    moved = f == 1;
  }
  while (!p.out.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    size_t want = 0;
    for (size_t i = 0; i < p.out.size() && n + 2 <= kMaxIov; ++i) {
      Out& o = p.out[i];
      if (o.done < kHdr) iov[n++] = {o.hdr.data() + o.done, kHdr - o.done};
      size_t pd = o.done > kHdr ? o.done - kHdr : 0;
      if (o.bytes > pd) iov[n++] = {const_cast<char*>(o.data) + pd, o.bytes - pd};
      want += kHdr + o.bytes - o.done;
    }
    ssize_t r = stream_writev(p.fd, p.tls, iov, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
      fail(p, errno, "send");
    }
    moved = moved || r > 0;
    size_t left = static_cast<size_t>(r);
    while (left > 0) {
      Out& o = p.out.front();
      size_t take = std::min(left, kHdr + o.bytes - o.done);
      o.done += take;
      left -= take;
      if (o.done == kHdr + o.bytes) p.out.pop_front();
    }
    if (static_cast<size_t>(r) < want) return moved;  // socket buffer full
  }
  return moved;
}

void StreamPump::check_header(const Peer& p, const In& in) const {
  // No size cap: the size must be the expected one.
  transport::Header h;
  Status st = transport::decode_header(in.hdr, UINT64_MAX, &h);
  if (st && (h.type != transport::msg::kStreamData || h.request_id != in.tag ||
             h.payload_bytes != in.bytes))
    st = Status(ErrorCode::kProtocolError,
                fmt::format("streams out of step: got message {:#x} of {} bytes (type {}), "
                            "expected {:#x} of {} bytes",
                            h.request_id, h.payload_bytes, h.type, in.tag, in.bytes));
  if (!st)
    t_.stream_error(p.peer, fmt::format("{} ({})", st.message(), what_), ErrorCode::kProtocolError)
        .raise();
}

bool StreamPump::read_some(Peer& p, size_t last) {
  bool moved = false;
  while (p.in_next < p.in.size() && p.in_next <= last) {
    // One readv over as many queued receives as allowed: fewer system calls,
    // and large reads are what loopback TCP needs to run near its ceiling.
    iovec iov[kMaxIov];
    int n = 0;
    size_t want = 0;
    for (size_t i = p.in_next; i < p.in.size() && i <= last && n + 2 <= kMaxIov; ++i) {
      In& in = p.in[i];
      if (in.done < kHdr) iov[n++] = {in.hdr.data() + in.done, kHdr - in.done};
      size_t pd = in.done > kHdr ? in.done - kHdr : 0;
      if (in.bytes > pd) iov[n++] = {in.dst + pd, in.bytes - pd};
      want += kHdr + in.bytes - in.done;
    }
    ssize_t r = stream_readv(p.fd, p.tls, iov, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
      fail(p, errno, "receive");
    }
    if (r == 0) fail(p, 0, "receive");
    moved = true;
    size_t left = static_cast<size_t>(r);
    while (left > 0) {
      In& in = p.in[p.in_next];
      const bool had_header = in.done >= kHdr;
      size_t take = std::min(left, kHdr + in.bytes - in.done);
      in.done += take;
      left -= take;
      if (!had_header && in.done >= kHdr) check_header(p, in);
      if (in.done == kHdr + in.bytes) ++p.in_next;
    }
    if (static_cast<size_t>(r) < want) return moved;  // drained
  }
  return moved;
}

void StreamPump::progress(int read_peer, size_t last, const std::function<bool()>& done) {
  auto deadline = Clock::now() + timeout_;
  std::vector<pollfd> fds;
  auto yield_until = Clock::now() + kYieldWindow;
  while (!done()) {
    for (auto& check : checks_)
      check();
    bool moved = false;
    for (auto& p : peers_)
      moved |= write_some(p);
    for (auto& p : peers_)
      if (read_peer == -1 || p.peer == read_peer)
        moved |= read_some(p, read_peer == -1 ? SIZE_MAX : last);
    if (done()) return;
    if (moved) {
      deadline = Clock::now() + timeout_;
      yield_until = Clock::now() + kYieldWindow;
      continue;
    }
    // Nothing to do: first yield the core and look again for a short while
    // (a message is usually microseconds away, and a wake-up from poll()
    // costs tens of them on a busy host), then block in poll().
    if (Clock::now() < yield_until) {
      sched_yield();
      continue;
    }
    fds.clear();
    for (auto& p : peers_) {
      short ev = p.out.empty() && !tls_pending(p.tls) ? 0 : POLLOUT;
      if ((read_peer == -1 || p.peer == read_peer) && p.in_next < p.in.size()) ev |= POLLIN;
      if (ev) fds.push_back(pollfd{p.fd, ev, 0});
    }
    if (!fds.empty())
      for (int fd : watch_fds_)
        fds.push_back(pollfd{fd, POLLIN, 0});
    const size_t n = fds.size();
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    if (left <= 0 || n == 0)
      throw Timeout(fmt::format(
          "collective: {} made no progress for {} ms on rank {}; a peer is stuck or too slow "
          "(raise the peer timeout, or check the other ranks' logs)",
          what_, timeout_.count(), t_.rank()));
    int r =
        ::poll(fds.data(), static_cast<nfds_t>(n), static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno != EINTR)
      throw IoError(fmt::format("collective: poll failed: {}", std::strerror(errno)));
    if (t_.is_closed()) t_.stream_error(-1, "closed").raise();
  }
}

StreamWriter::StreamWriter(DirectStreams& t, int peer, std::vector<Msg> msgs,
                           Millis progress_timeout, std::string what)
    : t_(t),
      peer_(peer),
      fd_(t.stream_fd(peer)),
      tls_(t.stream_tls(peer)),
      msgs_(std::move(msgs)),
      hdrs_(msgs_.size()),
      timeout_(progress_timeout),
      what_(std::move(what)) {
  if (fd_ < 0)
    throw InvalidArgument(
        fmt::format("collective: rank {} has no data stream to rank {}", t.rank(), peer));
  for (size_t i = 0; i < msgs_.size(); ++i)
    hdrs_[i] = stream_header(msgs_[i].tag, msgs_[i].bytes);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  error_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0 || error_fd_ < 0)
    throw IoError(fmt::format("collective: eventfd failed: {}", std::strerror(errno)));
  try {
    t_.writer_thread().start([this] { run(); });
  } catch (...) {
    ::close(wake_fd_);
    ::close(error_fd_);
    throw;
  }
  started_ = true;
}

StreamWriter::~StreamWriter() {
  bool unfinished;
  {
    std::lock_guard lock(mu_);
    unfinished = !done_;
    abort_ = true;
  }
  cv_.notify_all();
  uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_fd_, &one, sizeof one);
  if (started_) t_.writer_thread().wait();
  ::close(wake_fd_);
  ::close(error_fd_);
  if (unfinished) ::shutdown(fd_, SHUT_RDWR);
}

void StreamWriter::release(size_t count) {
  {
    std::lock_guard lock(mu_);
    if (count <= released_) return;
    released_ = std::min(count, msgs_.size());
  }
  cv_.notify_one();
}

void StreamWriter::finish() {
  std::unique_lock lock(mu_);
  // The thread enforces the progress deadline itself; this bound only
  // guards against a thread that stopped reporting.
  if (!cv_.wait_for(lock, timeout_ * 2 + Millis(1000), [&] { return done_; }))
    throw Timeout(
        fmt::format("collective: {}: the writer to rank {} did not finish", what_, peer_));
  error_.raise();
}

Status StreamWriter::write_all_released(size_t& next, size_t& offset, size_t released) {
  auto deadline = Clock::now() + timeout_;
  while (next < released || tls_pending(tls_)) {
    bool again = false;  // all of it was taken: write again at once
    ssize_t r;
    if (next < released) {
      iovec iov[kMaxIov];
      int n = 0;
      size_t want = 0;
      for (size_t i = next, off = offset; i < released && n + 2 <= kMaxIov; ++i, off = 0) {
        if (off < kHdr) iov[n++] = {hdrs_[i].data() + off, kHdr - off};
        size_t pd = off > kHdr ? off - kHdr : 0;
        if (msgs_[i].bytes > pd)
          iov[n++] = {const_cast<char*>(static_cast<const char*>(msgs_[i].data)) + pd,
                      msgs_[i].bytes - pd};
        want += kHdr + msgs_[i].bytes - off;
      }
      r = stream_writev(fd_, tls_, iov, n);
      if (r > 0) {
        deadline = Clock::now() + timeout_;
        size_t left = static_cast<size_t>(r);
        while (left > 0) {
          size_t take = std::min(left, kHdr + msgs_[next].bytes - offset);
          offset += take;
          left -= take;
          if (offset == kHdr + msgs_[next].bytes) ++next, offset = 0;
        }
        again = static_cast<size_t>(r) == want;
      }
    } else {
      r = tls_->flush();  // everything was taken: what the TLS link holds goes out
      if (r == 1) break;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return t_.stream_error(peer_, fmt::format("send failed: {}", std::strerror(errno)));
    if (again) continue;
    // Socket buffer full: block until writable, aborted, or the deadline.
    pollfd fds[2] = {{fd_, POLLOUT, 0}, {wake_fd_, POLLIN, 0}};
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    if (left <= 0)
      return Status(ErrorCode::kTimeout,
                    fmt::format("collective: {}: sending to rank {} made no progress for {} ms",
                                what_, peer_, timeout_.count()));
    ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 1000)));
    {
      std::lock_guard lock(mu_);
      if (abort_) return Status(ErrorCode::kIoError, "aborted");
    }
  }
  return Status::ok();
}

void StreamWriter::run() {
  size_t next = 0, offset = 0;
  Status st;
  while (next < msgs_.size()) {
    size_t released;
    {
      std::unique_lock lock(mu_);
      if (!cv_.wait_for(lock, timeout_, [&] { return abort_ || released_ > next; })) {
        st = Status(ErrorCode::kTimeout,
                    fmt::format("collective: {}: message {} to rank {} was never released", what_,
                                next, peer_));
        break;
      }
      if (abort_) break;
      released = released_;
    }
    st = write_all_released(next, offset, released);
    if (!st.is_ok()) break;
  }
  {
    std::lock_guard lock(mu_);
    done_ = true;
    error_ = st;
  }
  cv_.notify_all();
  if (!st.is_ok()) {
    uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(error_fd_, &one, sizeof one);
  }
}

void StreamWriter::check() {
  std::lock_guard lock(mu_);
  if (done_ && !abort_) error_.raise();
}

}  // namespace pushpull::transport
