// SPDX-License-Identifier: Apache-2.0
// Transport: the write path (TCP batches, net control frames and payloads
// through the connection's shared-memory ring) and the same-host setup
// (net/shm_setup.h has the protocol, net/shm_segment.h the rings).
#include <sys/epoll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/metrics.h"
#include "net/conn.h"
#include "net/host_identity.h"
#include "net/shm_setup.h"
#include "net/wire.h"
#include "pushpull/log.h"

namespace pushpull::net {
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
void decide_path(const Transport::Conn& c, SendOp& op, size_t min_payload) {
  if (op.path != SendOp::Path::kUndecided) return;
  if (c.shm_out_ready && op.len > 0 && op.len >= min_payload) {
    op.path = SendOp::Path::kShm;
    store_le<uint32_t>(op.header.data() + 36, kNetFlagShmPayload);
  } else {
    op.path = SendOp::Path::kTcp;
  }
}

}  // namespace

void Transport::arm_output(Conn& c) {
  const bool out = c.want_out && !c.ring_blocked;
  if (out == c.out_armed) return;
  c.out_armed = out;
  epoll_event ev{};
  ev.events = out ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
  ev.data.ptr = &c;
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
}

// Called with send_mu held after write_some(): who continues and when.
void Transport::after_write(Conn& c, WriteState r) {
  c.want_out = r != WriteState::kIdle;
  c.ring_blocked = r == WriteState::kRingFull;
  arm_output(c);
}

void Transport::complete_sends(Conn* c, std::vector<SendOp>& completed) {
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
bool Transport::write_tcp_batch(Conn& c, std::vector<SendOp>& completed, bool* would_block_out) {
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
bool Transport::fill_piece(Conn& c, SendOp& op) {
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
Transport::WriteState Transport::write_some(Conn& c, std::vector<SendOp>& completed) {
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

void Transport::queue_ctl(Conn& c, Header h, const std::vector<std::byte>& payload,
                          bool activates) {
  CtlFrame f;
  f.bytes.resize(kHeaderBytes + payload.size());
  encode_header(stamp(h, payload.size()),
                std::span<std::byte, kHeaderBytes>(f.bytes.data(), kHeaderBytes));
  if (!payload.empty()) std::memcpy(f.bytes.data() + kHeaderBytes, payload.data(), payload.size());
  f.activates = activates;
  std::vector<SendOp> completed;
  {
    std::lock_guard lock(c.send_mu);
    if (c.closed) return;
    c.ctl.push_back(std::move(f));
    if (!c.want_out || c.ring_blocked) after_write(c, write_some(c, completed));
  }
  complete_sends(&c, completed);
}

// Tells the peer we consumed its ring up to `pos` (I/O thread). An unsent
// release is updated in place, so releases never pile up.
void Transport::queue_release(Conn& c, uint64_t pos) {
  c.shm_release_sent = pos;
  Header h{.type = msg::kShmRelease, .offset = pos};
  h.version = config_.protocol_version;
  std::vector<SendOp> completed;
  {
    std::lock_guard lock(c.send_mu);
    if (c.closed) return;
    if (!c.ctl.empty() && c.ctl.back().release && c.ctl.back().written == 0) {
      encode_header(h, std::span<std::byte, kHeaderBytes>(c.ctl.back().bytes.data(), kHeaderBytes));
    } else {
      CtlFrame f;
      f.bytes.resize(kHeaderBytes);
      encode_header(h, std::span<std::byte, kHeaderBytes>(f.bytes.data(), kHeaderBytes));
      f.release = true;
      c.ctl.push_back(std::move(f));
    }
    if (!c.want_out || c.ring_blocked) after_write(c, write_some(c, completed));
  }
  complete_sends(&c, completed);
}

void Transport::settle_shm(Conn& c) {
  {
    std::lock_guard lock(c.shm_mu);
    c.shm_settled = true;
  }
  c.shm_cv.notify_all();
}

void Transport::wait_shm_settled(Conn& c, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(c.shm_mu);
  if (!c.shm_cv.wait_until(lock, deadline, [&] { return c.shm_settled; }))
    PP_WARN(
        "the shared-memory setup with {} did not finish in time; its messages use TCP until "
        "it does",
        c.peer.describe());
}

// The connector's first step, before the connection is visible to the I/O
// thread (the offer itself is queued once it is).
void Transport::offer_shm(Conn& c) {
  std::string why;
  c.shm_mine = ShmSegment::create(config_.shm_ring_bytes, config_.shm_dir, &why);
  if (!c.shm_mine) {
    PP_DEBUG("no shared memory with {}: {}", c.peer.describe(), why);
    c.shm_state = Conn::ShmState::kOff;
    settle_shm(c);
    return;
  }
  c.shm_state = Conn::ShmState::kOffered;
}

void Transport::shm_protocol_error(Conn& c, const std::string& what) {
  Status st{ErrorCode::kProtocolError, what};
  PP_ERROR("ProtocolError from {}: {}; closing that connection", c.peer.describe(), what);
  close_conn(c, st, true);
}

// kShmPiece and kShmRelease (bare headers), on the I/O thread. False when
// the connection was closed.
bool Transport::on_shm_frame(Conn& c, const Header& h) {
  if (h.payload_bytes != 0 || h.net_flags != 0) {
    shm_protocol_error(c, "a shared-memory frame carries a payload or flags");
    return false;
  }
  if (h.type == msg::kShmRelease) {
    std::vector<SendOp> completed;
    bool bad = false;
    {
      std::lock_guard lock(c.send_mu);
      if (!c.shm_out || h.offset < c.shm_released || h.offset > c.shm_written) {
        bad = true;
      } else {
        c.shm_released = h.offset;
        if (c.ring_blocked && !c.closed) after_write(c, write_some(c, completed));
      }
    }
    complete_sends(&c, completed);
    if (bad) {
      shm_protocol_error(c, fmt::format("a shared-memory release to position {} that was never "
                                        "written",
                                        h.offset));
      return false;
    }
    return c.state != Conn::State::kClosed;
  }
  if (!c.shm_payload || !c.shm_in) {
    shm_protocol_error(c, "a shared-memory piece outside a shared-memory payload");
    return false;
  }
  if (h.offset != c.shm_read || h.length == 0 || h.length > c.payload_left() ||
      h.length > c.shm_in->ring_bytes()) {
    shm_protocol_error(
        c, fmt::format("a shared-memory piece of {} bytes at position {} (expected position {}, "
                       "at most {} bytes)",
                       h.length, h.offset, c.shm_read, c.payload_left()));
    return false;
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  uint64_t left = h.length;
  while (left > 0) {
    size_t room = 0;
    std::byte* dst = payload_room(c, &room);
    const size_t take = static_cast<size_t>(std::min<uint64_t>(room, left));
    if (dst != nullptr) c.shm_in->read(c.shm_read, dst, take);
    c.got += take;
    c.shm_read += take;
    left -= take;
  }
  if (c.shm_read - c.shm_release_sent >= c.shm_in->ring_bytes() / 4) queue_release(c, c.shm_read);
  if (c.payload_left() == 0) finish_message(c);
  return c.state != Conn::State::kClosed;
}

// kShmOffer / kShmAnswer / kShmConfirm, on the I/O thread.
void Transport::on_shm_setup(Conn& c, Message&& m) {
  using S = Conn::ShmState;
  const std::span<const std::byte> in(m.payload.data(), m.payload.size());
  const uint16_t type = m.header.type;
  if (type == msg::kShmOffer) {
    ShmOffer offer;
    if (c.peer.outgoing || c.shm_state != S::kNone)
      return shm_protocol_error(c, "an unexpected shared-memory offer");
    if (Status st = decode(in, &offer); !st) return shm_protocol_error(c, st.message());
    ShmAnswer answer;
    std::string why;
    if (!config_.shared_memory) {
      why = "shared memory is off on this node";
    } else if (offer.host != host_identity()) {
      // Another network namespace of this kernel can still open our
      // segments, but it stands for another machine: its bytes must cross
      // the links between them.
      why = "another host (its kernel, host name or network namespace differs)";
    } else if (auto theirs = ShmSegment::open(offer.name, config_.shm_dir, &why)) {
      if (theirs->ring_bytes() != offer.ring_bytes)
        return shm_protocol_error(c, "the offered shared-memory ring has another size");
      if (auto mine = ShmSegment::create(config_.shm_ring_bytes, config_.shm_dir, &why)) {
        answer.accepted = true;
        answer.token = theirs->token();
        answer.name = mine->name();
        answer.ring_bytes = mine->ring_bytes();
        c.shm_in = std::move(theirs);
        c.shm_mine = std::move(mine);
      }
    }
    if (!answer.accepted) {
      PP_DEBUG("no shared memory with {}: {}", c.peer.describe(), why);
      answer.reason = why;
    }
    c.shm_state = answer.accepted ? S::kAnswered : S::kOff;
    if (answer.accepted) {
      // Our ring carries payloads from right after the answer (the frame
      // activates it): the connector maps it before it reads anything that
      // follows. Its name is unlinked once the connector proves it mapped it.
      std::lock_guard lock(c.send_mu);
      c.shm_out = std::move(c.shm_mine);
    }
    queue_ctl(c, Header{.type = msg::kShmAnswer}, encode(answer), answer.accepted);
    return;
  }
  if (type == msg::kShmAnswer) {
    ShmAnswer answer;
    if (!c.peer.outgoing || c.shm_state != S::kOffered)
      return shm_protocol_error(c, "an unexpected shared-memory answer");
    if (Status st = decode(in, &answer); !st) return shm_protocol_error(c, st.message());
    if (!answer.accepted) {
      PP_DEBUG("no shared memory with {}: {}", c.peer.describe(), answer.reason);
      c.shm_mine.reset();
      c.shm_state = S::kOff;
      settle_shm(c);
      return;
    }
    if (!proof_equal(answer.token, c.shm_mine->token()))
      return shm_protocol_error(
          c, "the peer's shared-memory answer does not prove it mapped our ring");
    c.shm_mine->unlink();  // the peer has it mapped; nobody else may open it
    std::string why;
    ShmConfirm confirm;
    auto theirs = ShmSegment::open(answer.name, config_.shm_dir, &why);
    if (theirs && theirs->ring_bytes() != answer.ring_bytes)
      return shm_protocol_error(c, "the answered shared-memory ring has another size");
    if (!theirs) {
      // The acceptor may already be sending through it: without it this
      // connection cannot be read, so it closes (a resource failure here,
      // since the acceptor did map our ring on this host).
      Status st{ErrorCode::kIoError,
                fmt::format("cannot map the shared-memory ring of {}: {}", c.peer.describe(), why)};
      PP_ERROR("{}; closing that connection", st.message());
      close_conn(c, st, true);
      return;
    }
    confirm.accepted = true;
    confirm.token = theirs->token();
    c.shm_in = std::move(theirs);
    {
      std::lock_guard lock(c.send_mu);
      c.shm_out = std::move(c.shm_mine);
    }
    c.shm_state = S::kOn;
    queue_ctl(c, Header{.type = msg::kShmConfirm}, encode(confirm), true);
    return;
  }
  if (type == msg::kShmConfirm) {
    ShmConfirm confirm;
    if (c.peer.outgoing || c.shm_state != S::kAnswered)
      return shm_protocol_error(c, "an unexpected shared-memory confirmation");
    if (Status st = decode(in, &confirm); !st) return shm_protocol_error(c, st.message());
    if (!confirm.accepted)
      return shm_protocol_error(
          c, fmt::format("the peer cannot use the shared memory it accepted: {}", confirm.reason));
    bool proven;
    {
      std::lock_guard lock(c.send_mu);
      proven = c.shm_out && proof_equal(confirm.token, c.shm_out->token());
      if (proven) c.shm_out->unlink();  // mapped by the peer; nobody else may open it
    }
    if (!proven)
      return shm_protocol_error(
          c, "the peer's shared-memory confirmation does not prove it mapped our ring");
    c.shm_state = S::kOn;
    return;
  }
  shm_protocol_error(c, fmt::format("unknown message type {}", type));
}

}  // namespace pushpull::net
