// SPDX-License-Identifier: Apache-2.0
// MessageTransport: the same-host setup (transport/shm/shm_setup.h has the protocol,
// transport/shm/shm_segment.h the rings) and the shared-memory frames on the receive
// side. The write path is in message_transport_write.cpp.
#include <sys/epoll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/metrics.h"
#include "pushpull/log.h"
#include "transport/shm/shm_setup.h"
#include "transport/tcp/conn.h"
#include "transport/wire.h"

namespace pushpull::transport {
void MessageTransport::queue_ctl(Conn& c, Header h, const std::vector<std::byte>& payload,
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
void MessageTransport::queue_release(Conn& c, uint64_t pos) {
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

void MessageTransport::settle_shm(Conn& c) {
  {
    std::lock_guard lock(c.shm_mu);
    c.shm_settled = true;
  }
  c.shm_cv.notify_all();
}

void MessageTransport::wait_shm_settled(Conn& c, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(c.shm_mu);
  if (!c.shm_cv.wait_until(lock, deadline, [&] { return c.shm_settled; }))
    PP_WARN(
        "the shared-memory setup with {} did not finish in time; its messages use TCP until "
        "it does",
        c.peer.describe());
}

// The connector's first step, before the connection is visible to the I/O
// thread (the offer itself is queued once it is).
void MessageTransport::offer_shm(Conn& c) {
  if (Status st = ShmSegment::create(config_.shm_ring_bytes, config_.shm_dir, &c.shm_mine); !st) {
    PP_DEBUG("no shared memory with {}: {}", c.peer.describe(), st.message());
    c.shm_state = Conn::ShmState::kOff;
    settle_shm(c);
    return;
  }
  c.shm_state = Conn::ShmState::kOffered;
}

void MessageTransport::shm_protocol_error(Conn& c, const std::string& what) {
  Status st{ErrorCode::kProtocolError, what};
  PP_ERROR("ProtocolError from {}: {}; closing that connection", c.peer.describe(), what);
  close_conn(c, st, true);
}

// kShmPiece and kShmRelease (bare headers), on the I/O thread. False when
// the connection was closed.
bool MessageTransport::on_shm_frame(Conn& c, const Header& h) {
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
void MessageTransport::on_shm_setup(Conn& c, Message&& m) {
  using S = Conn::ShmState;
  const std::span<const std::byte> in(m.payload.data(), m.payload.size());
  const uint16_t type = m.header.type;
  if (type == msg::kShmOffer) {
    HostRecord offer;
    if (c.peer.outgoing || c.shm_state != S::kNone)
      return shm_protocol_error(c, "an unexpected shared-memory offer");
    if (Status st = decode(in, &offer); !st) return shm_protocol_error(c, st.message());
    ShmAnswer answer;
    std::unique_ptr<ShmSegment> theirs, mine;
    Status st;
    if (!config_.shared_memory) {
      answer.reason = "shared memory is off on this node";
    } else if (st = ShmSegment::open(offer, config_.shm_dir, &theirs); !st) {
      answer.reason = st.message();  // not proven: another host, user, file, ...
    } else if (st = ShmSegment::create(config_.shm_ring_bytes, config_.shm_dir, &mine); !st) {
      answer.reason = st.message();
    } else {
      answer.accepted = true;
      answer.ring = mine->record();
      c.shm_in = std::move(theirs);
      // Our ring carries payloads from right after the answer (the frame
      // activates it): the connector maps it before it reads anything that
      // follows. Its name is unlinked once the connector confirms.
      std::lock_guard lock(c.send_mu);
      c.shm_out = std::move(mine);
    }
    if (!answer.accepted)
      PP_DEBUG("no shared memory with {}: {}", c.peer.describe(), answer.reason);
    c.shm_state = answer.accepted ? S::kAnswered : S::kOff;
    queue_ctl(c, Header{.type = msg::kShmAnswer}, encode(answer), answer.accepted);
    return;
  }
  if (type == msg::kShmAnswer) {
    ShmAnswer answer;
    if (!c.peer.outgoing || c.shm_state != S::kOffered)
      return shm_protocol_error(c, "an unexpected shared-memory answer");
    if (Status st = decode(in, &answer); !st) return shm_protocol_error(c, st.message());
    c.shm_mine->unlink();  // mapped by the acceptor, or of no use: nobody else may open it
    if (!answer.accepted) {
      PP_DEBUG("no shared memory with {}: {}", c.peer.describe(), answer.reason);
      c.shm_mine.reset();
      c.shm_state = S::kOff;
      settle_shm(c);
      return;
    }
    std::unique_ptr<ShmSegment> theirs;
    if (Status st = ShmSegment::open(answer.ring, config_.shm_dir, &theirs); !st) {
      // The acceptor may already be sending through it: without it this
      // connection cannot be read, so it closes.
      Status why{st.code() == ErrorCode::kProtocolError ? st.code() : ErrorCode::kIoError,
                 fmt::format("cannot map the shared-memory ring of {}: {}", c.peer.describe(),
                             st.message())};
      PP_ERROR("{}; closing that connection", why.message());
      close_conn(c, why, true);
      return;
    }
    c.shm_in = std::move(theirs);
    {
      std::lock_guard lock(c.send_mu);
      c.shm_out = std::move(c.shm_mine);
    }
    c.shm_state = S::kOn;
    queue_ctl(c, Header{.type = msg::kShmConfirm}, {}, true);
    return;
  }
  if (type == msg::kShmConfirm) {
    if (c.peer.outgoing || c.shm_state != S::kAnswered || !in.empty())
      return shm_protocol_error(c, "an unexpected shared-memory confirmation");
    {
      std::lock_guard lock(c.send_mu);
      if (c.shm_out) c.shm_out->unlink();  // mapped by the peer; nobody else may open it
    }
    c.shm_state = S::kOn;
    return;
  }
  shm_protocol_error(c, fmt::format("unknown message type {}", type));
}

}  // namespace pushpull::transport
