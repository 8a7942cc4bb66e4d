// SPDX-License-Identifier: Apache-2.0
// MessageTransport: the write path (TCP batches, net control frames and payloads
// through the connection's shared-memory ring, all through the TLS link when
// on), called with the connection's send_mu held.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/metrics.h"
#include "transport/shm/shm_setup.h"
#include "transport/tcp/conn.h"
#include "transport/wire.h"

namespace pushpull::transport {
namespace {

// A piece is copied into the ring and announced in one go; smaller pieces
// let the reader start copying out sooner, larger ones need fewer frames.
size_t piece_bytes(size_t ring) {
  return std::min<size_t>(ring / 4, size_t{256} << 10);
}

bool would_block(int err) {
  return err == EAGAIN || err == EWOULDBLOCK;
}

uint16_t type_of(const SendOp& op) {
  return load_le<uint16_t>(op.header.data() + 6);
}

// Picks the path of a message whose header is about to go out: the ring
// when it is ready and the payload is big enough (the header then says so).
void decide_path(const MessageTransport::Conn& c, SendOp& op, size_t min_payload) {
  if (op.path != SendOp::Path::kUndecided) return;
  if (c.shm_out_ready && op.len > 0 && op.len >= min_payload) {
    op.path = SendOp::Path::kShm;
    store_le<uint32_t>(op.header.data() + 36, kNetFlagShmPayload);
  } else {
    op.path = SendOp::Path::kTcp;
  }
}

}  // namespace

void MessageTransport::arm_output(Conn& c) {
  const bool out = c.want_out && !c.ring_blocked;
  if (out == c.out_armed) return;
  c.out_armed = out;
  epoll_event ev{};
  ev.events = out ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
  ev.data.ptr = &c;
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
}

// Called with send_mu held after write_some(): who continues and when.
void MessageTransport::after_write(Conn& c, WriteState r) {
  c.want_out = r != WriteState::kIdle;
  c.ring_blocked = r == WriteState::kRingFull;
  arm_output(c);
}

void MessageTransport::complete_sends(Conn* c, std::vector<SendOp>& completed) {
  for (auto& op : completed) {
    --queued_;
    if (!op.done) continue;
    if (c != nullptr)
      run_guarded(c, "a send completion", [&] { op.done(Status{}); });
    else
      op.done(Status{});
  }
  completed.clear();
}

// Writes the TCP ops at the head of the queue (one sendmsg). False on a hard
// error (errno kept); *would_block when the socket is full.
bool MessageTransport::write_tcp_batch(Conn& c, std::vector<SendOp>& completed,
                                       bool* would_block_out) {
  constexpr int kMaxIov = 64;
  auto& q = c.queue;
  iovec iov[kMaxIov];
  int n = 0;
  for (size_t i = 0; i < q.size() && n + 2 <= kMaxIov; ++i) {
    SendOp& op = q[i];
    decide_path(c, op, config_.shm_min_payload);
    if (op.path != SendOp::Path::kTcp) break;
    size_t w = op.written;
    if (w < kHeaderBytes) iov[n++] = {op.header.data() + w, kHeaderBytes - w};
    size_t pw = w > kHeaderBytes ? w - kHeaderBytes : 0;
    if (op.len > pw) iov[n++] = {const_cast<std::byte*>(op.data) + pw, op.len - pw};
    if (!c.ctl.empty()) break;  // let control frames out between messages
  }
  ssize_t r = c.send_iov(iov, n);
  if (r < 0) {
    if (errno == EINTR) return true;
    *would_block_out = would_block(errno);
    return *would_block_out;
  }
  if (r == 0) {
    *would_block_out = true;
    return true;
  }
  // Payload bytes between servers and workers (the scheduler's control
  // traffic carries no tensors and never uses shared memory).
  auto data_role = [](Role r) { return r == Role::kServer || r == Role::kWorker; };
  const bool count = data_role(config_.role) && data_role(c.peer.role);
  size_t left = static_cast<size_t>(r);
  while (left > 0 && !q.empty()) {
    SendOp& op = q.front();
    size_t take = std::min(left, op.total() - op.written);
    op.written += take;
    left -= take;
    if (op.written == op.total()) {
      if (count && type_of(op) > msg::kNetLast)
        metrics::add(metrics::Counter::kNetTcpBytes, op.len);
      completed.push_back(std::move(op));
      q.pop_front();
    }
  }
  return true;
}

// Copies the next piece of `op` into our ring and prepares its frame; false
// when the ring is full (the peer has not released enough yet).
bool MessageTransport::fill_piece(Conn& c, SendOp& op) {
  const size_t ring = c.shm_out->ring_bytes();
  const uint64_t used = c.shm_written - c.shm_released;
  if (used >= ring) return false;
  const size_t k =
      std::min({static_cast<size_t>(ring - used), op.len - op.shm_copied, piece_bytes(ring)});
  c.shm_out->write(c.shm_written, op.data + op.shm_copied, k);
  Header h{.type = msg::kShmPiece, .offset = c.shm_written, .length = k};
  h.version = config_.protocol_version;
  op.piece = encode_header(h);
  op.piece_written = 0;
  op.piece_pending = true;
  c.shm_written += k;
  op.shm_copied += k;
  return true;
}

// Writes control frames, messages and pieces in stream order until the
// socket or the ring is full or nothing is left. Called with send_mu held.
MessageTransport::WriteState MessageTransport::write_some(Conn& c, std::vector<SendOp>& completed) {
  auto& q = c.queue;
  // With TLS, ciphertext the socket did not take yet goes first; nothing
  // else moves before the TLS handshake is done (tls_accept_step flushes
  // then). Bytes the link took are sent by it later: while it holds some,
  // keep watching for EPOLLOUT even with nothing queued or the ring full.
  if (c.tls) {
    if (c.tls->flush() < 0) return WriteState::kError;
    if (!c.tls->established())
      return c.tls->output_pending() ? WriteState::kSocketFull : WriteState::kIdle;
  }
  auto stopped = [&c](WriteState s) {
    return c.tls_output_pending() && s != WriteState::kError ? WriteState::kSocketFull : s;
  };
  while (true) {
    if (!c.ctl.empty()) {
      const SendOp* head = q.empty() ? nullptr : &q.front();
      // Control frames go between messages or between the pieces of a shm
      // payload, never inside a TCP payload or a frame.
      const bool between = head == nullptr || head->written == 0 ||
                           (head->path == SendOp::Path::kShm && head->written == kHeaderBytes &&
                            !head->piece_pending);
      CtlFrame& f = c.ctl.front();
      if (between || f.written > 0) {
        iovec v{f.bytes.data() + f.written, f.bytes.size() - f.written};
        ssize_t r = c.send_iov(&v, 1);
        if (r < 0) {
          if (errno == EINTR) continue;
          return would_block(errno) ? WriteState::kSocketFull : WriteState::kError;
        }
        f.written += static_cast<size_t>(r);
        if (f.written == f.bytes.size()) {
          if (f.activates) {
            c.shm_out_ready = true;  // the peer reads the confirmation before anything flagged
            settle_shm(c);
          }
          c.ctl.pop_front();
        }
        continue;
      }
    }
    if (q.empty()) return stopped(WriteState::kIdle);
    SendOp& op = q.front();
    decide_path(c, op, config_.shm_min_payload);
    if (op.path != SendOp::Path::kShm) {
      bool blocked = false;
      if (!write_tcp_batch(c, completed, &blocked)) return WriteState::kError;
      if (blocked) return WriteState::kSocketFull;
      continue;
    }
    if (op.written == 0 && !op.piece_pending && !fill_piece(c, op))
      return stopped(WriteState::kRingFull);
    if (op.written < kHeaderBytes || op.piece_pending) {
      iovec iov[2];
      int n = 0;
      if (op.written < kHeaderBytes)
        iov[n++] = {op.header.data() + op.written, kHeaderBytes - op.written};
      if (op.piece_pending)
        iov[n++] = {op.piece.data() + op.piece_written, kHeaderBytes - op.piece_written};
      // The ring's bytes are visible before the frame that announces them.
      std::atomic_thread_fence(std::memory_order_release);
      ssize_t r = c.send_iov(iov, n);
      if (r < 0) {
        if (errno == EINTR) continue;
        return would_block(errno) ? WriteState::kSocketFull : WriteState::kError;
      }
      size_t left = static_cast<size_t>(r);
      size_t h = std::min(left, kHeaderBytes - op.written);
      op.written += h;
      left -= h;
      if (op.piece_pending) {
        op.piece_written += left;
        if (op.piece_written == kHeaderBytes) op.piece_pending = false;
      }
      if (op.written == kHeaderBytes && !op.piece_pending && op.shm_copied == op.len) {
        metrics::add(metrics::Counter::kNetShmBytes, static_cast<int64_t>(op.len));
        completed.push_back(std::move(op));
        q.pop_front();
      }
      continue;
    }
    if (!fill_piece(c, op)) return stopped(WriteState::kRingFull);
  }
}

void MessageTransport::flush(Conn& c) {
  std::vector<SendOp> completed;
  WriteState r;
  int err = 0;
  {
    std::lock_guard lock(c.send_mu);
    if (c.closed) return;
    r = write_some(c, completed);
    err = errno;
    if (r != WriteState::kError) after_write(c, r);
  }
  complete_sends(&c, completed);
  if (r == WriteState::kError && c.state != Conn::State::kClosed) {
    Status why{ErrorCode::kIoError, fmt::format("send failed: {}", std::strerror(err))};
    if (c.state == Conn::State::kHandshake) {
      refuse_stranger(c, why.message(), false);
      return;
    }
    // A peer that is going away may have said why just before it closed (a
    // verdict naming the node that failed first): deliver what it sent before
    // this connection is closed and its peer suspected, or the closing peer
    // is blamed for a failure it only reported.
    drain_before_close(c);
    close_conn(c, why, true);  // a no-op when the drain met the close first
  }
}

void MessageTransport::drain_before_close(Conn& c) {
  // Bounded: a peer that keeps sending cannot hold the I/O thread here.
  for (int round = 0; round < kDrainRounds && c.state == Conn::State::kOpen; ++round) {
    pollfd p{c.fd.get(), POLLIN, 0};
    const bool buffered = c.tls && c.tls->input_buffered();
    if (!buffered && (::poll(&p, 1, 0) <= 0 || !(p.revents & (POLLIN | POLLHUP | POLLERR)))) return;
    on_readable(c);
  }
}

}  // namespace pushpull::transport
