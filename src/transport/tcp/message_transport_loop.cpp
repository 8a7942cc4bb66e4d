// SPDX-License-Identifier: Apache-2.0
// MessageTransport: the I/O thread (epoll loop, the receive state machine,
// flushing send queues, closing). Accepting is in message_transport_accept.cpp, the
// acceptor side of the hello in message_transport_hello.cpp, writing in
// message_transport_write.cpp.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "pushpull/log.h"
#include "transport/address.h"
#include "transport/shm/shm_setup.h"
#include "transport/tcp/conn.h"

namespace pushpull::transport {

namespace {
constexpr size_t kDirectRead = 16 << 10;  // payload rest read straight into place above this
constexpr size_t kReadBudget = 8 << 20;   // per wakeup per connection, for fairness
// A payload buffer starts at this size and grows 16x as bytes arrive, so a
// header alone never makes the node allocate more than this, memory stays
// within 16x of what the peer really sent, and the growth copies stay small
// (256 KiB for a 4 MiB PS chunk, 4.25 MiB for 64 MiB).
constexpr size_t kFirstChunk = 256 << 10;
constexpr size_t kGrowth = 16;
}  // namespace

void MessageTransport::loop() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  while (!stopping_) {
    // The timeout only serves the handshake deadlines and a paused listener;
    // otherwise this blocks.
    int timeout_ms = 500;
    if (tls_) {  // only TLS links hold records the socket no longer signals
      std::lock_guard lock(mu_);
      if (!read_again_.empty()) timeout_ms = 0;
    }
    if (listen_paused_) {
      auto left =
          std::chrono::duration_cast<Millis>(listen_resume_ - std::chrono::steady_clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, timeout_ms));
    }
    int n = epoll_wait(epoll_fd_.get(), events, kMaxEvents, timeout_ms);
    if (n < 0 && errno != EINTR) {
      PP_ERROR("epoll_wait failed: {}", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n && !stopping_; ++i) {
      void* p = events[i].data.ptr;
      if (p == nullptr) {
        uint64_t v;
        [[maybe_unused]] auto r = ::read(wake_fd_.get(), &v, sizeof v);
        if (in_process_) accept_adopted();
        continue;
      }
      if (p == &listen_fd_) {
        accept_all();
        continue;
      }
      auto* c = static_cast<Conn*>(p);
      // Closed connections stay in graveyard_ until this batch is done, so
      // the pointer is valid here.
      if (c->state == Conn::State::kClosed) continue;
      if (events[i].events & EPOLLOUT) flush(*c);
      if (c->state != Conn::State::kClosed && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        on_readable(*c);
    }
    std::vector<ConnId> again;
    if (tls_) {
      std::lock_guard lock(mu_);
      again.swap(read_again_);
    }
    for (ConnId id : again)
      if (auto c = find(id); c && c->state != Conn::State::kClosed) on_readable(*c);
    std::vector<std::pair<ConnId, Status>> closing;
    std::vector<std::shared_ptr<Conn>> expired;
    auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(mu_);
      closing.swap(to_close_);
      for (auto& [id, c] : conns_)
        if (c->state == Conn::State::kHandshake && now > c->handshake_deadline)
          expired.push_back(c);
    }
    for (auto& [id, why] : closing)
      if (auto c = find(id)) close_conn(*c, why, true);
    for (auto& c : expired) {
      refuse_stranger(*c,
                      c->held ? "this node got no rank from the scheduler in time to answer"
                              : "no hello within the handshake timeout",
                      false);
    }
    release_held_hellos();
    resume_listener_if_due();
    std::vector<std::shared_ptr<Conn>> dead;
    {
      std::lock_guard lock(mu_);
      dead.swap(graveyard_);
    }
  }
  std::unordered_map<ConnId, std::shared_ptr<Conn>> all;
  {
    std::lock_guard lock(mu_);
    all.swap(conns_);
  }
  for (auto& [id, c] : all)
    close_conn(*c, {ErrorCode::kIoError, "transport stopped"}, false);
}

void MessageTransport::on_readable(Conn& c) {
  if (c.tls_handshaking() && !tls_accept_step(c)) return;
  size_t budget = kReadBudget;
  auto fail_io = [&](ssize_t r) {
    const int err = errno;
    std::string detail = c.tls ? c.tls->error() : std::string();
    if (detail.empty()) detail = std::strerror(err);
    Status why = r == 0 ? Status{ErrorCode::kIoError, "connection closed by the peer"}
                        : Status{ErrorCode::kIoError, fmt::format("receive failed: {}", detail)};
    if (c.state == Conn::State::kHandshake)
      refuse_stranger(c, fmt::format("gone before authenticating ({})", why.message()), false);
    else
      close_conn(c, why, true);
  };
  while (budget > 0 && c.state != Conn::State::kClosed) {
    if (c.tcp_payload() && c.st_begin == c.st_end && c.payload_left() >= kDirectRead) {
      size_t room = 0;
      std::byte* dst = payload_room(c, &room);
      // A dropped payload (oversize for its post) goes through the empty staging area.
      ssize_t r = dst != nullptr ? c.recv_bytes(dst, room)
                                 : c.recv_bytes(c.staging.get(), std::min(room, Conn::kStaging));
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return fail_io(r);
      c.got += static_cast<size_t>(r);
      budget -= std::min(budget, static_cast<size_t>(r));
      if (c.payload_left() == 0) finish_message(c);
      continue;
    }
    if (c.st_begin == c.st_end) {
      c.st_begin = c.st_end = 0;
      ssize_t r = c.recv_bytes(c.staging.get(), Conn::kStaging);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return fail_io(r);
      c.st_end = static_cast<size_t>(r);
      budget -= std::min(budget, static_cast<size_t>(r));
    }
    while (c.st_begin < c.st_end && c.state != Conn::State::kClosed) {
      size_t avail = c.st_end - c.st_begin;
      if (!c.tcp_payload()) {
        size_t take = std::min(avail, kHeaderBytes - c.hdr_got);
        std::memcpy(c.hdr_bytes.data() + c.hdr_got, c.staging.get() + c.st_begin, take);
        c.hdr_got += take;
        c.st_begin += take;
        if (c.hdr_got == kHeaderBytes) on_header(c);
      } else {
        size_t room = 0;
        std::byte* dst = payload_room(c, &room);
        size_t take = std::min(avail, room);
        if (dst != nullptr) std::memcpy(dst, c.staging.get() + c.st_begin, take);
        c.got += take;
        c.st_begin += take;
        if (c.payload_left() == 0) finish_message(c);
      }
    }
  }
  // Out of budget with records already read off the socket: no readiness
  // event will come for them.
  if (c.tls && c.state != Conn::State::kClosed && c.tls->input_buffered()) read_again_later(c);
}

// Where the next payload bytes go and how many fit there (> 0 while the
// payload is incomplete); nullptr when they are to be dropped.
std::byte* MessageTransport::payload_room(Conn& c, size_t* room) {
  const size_t left = c.payload_left();
  if (c.discard) {
    *room = left;
    return nullptr;
  }
  if (c.active) {
    *room = left;
    return c.dst + c.got;
  }
  if (c.got == c.buf.size()) {
    // Grow by kGrowth (at least kFirstChunk), never past the announced size.
    const size_t total = c.hdr.payload_bytes;
    size_t next = std::min<uint64_t>(total, std::max(kFirstChunk, c.got * kGrowth));
    Buffer bigger = pool_.acquire(next);
    if (c.got > 0) std::memcpy(bigger.data(), c.buf.data(), c.got);
    c.buf = std::move(bigger);
    c.dst = c.buf.data();
  }
  *room = std::min(left, c.buf.size() - c.got);
  return c.dst + c.got;
}

void MessageTransport::on_header(Conn& c) {
  c.hdr_got = 0;
  const bool handshake = c.state == Conn::State::kHandshake;
  Header h;
  Status st = decode_header(c.hdr_bytes, handshake ? kMaxHelloBytes : config_.net.max_message_bytes,
                            &h, config_.protocol_version);
  // Shared-memory frames are bare headers inside or between messages: they
  // leave the current message's state alone.
  if (st && !handshake && (h.type == msg::kShmPiece || h.type == msg::kShmRelease)) {
    on_shm_frame(c, h);
    return;
  }
  if (st && !handshake && c.shm_payload)
    st = {ErrorCode::kProtocolError,
          fmt::format("message type {} inside a shared-memory payload", h.type)};
  c.hdr = h;
  if (st && handshake && (c.hdr.type != msg::kHello || c.hello_seen))
    st = {ErrorCode::kProtocolError,
          c.hello_seen ? std::string("sent more than one hello")
                       : fmt::format("expected a hello, got message type {}", c.hdr.type)};
  if (st && !handshake && c.hdr.type <= msg::kNetLast) {
    // The shared-memory setup (transport/shm/shm_setup.h), handled by the net layer.
    if (c.hdr.type < msg::kShmOffer || c.hdr.type > msg::kShmConfirm || c.hdr.net_flags != 0)
      st = {ErrorCode::kProtocolError, fmt::format("unexpected net message type {}", c.hdr.type)};
    else if (c.hdr.payload_bytes > kMaxShmSetupBytes)
      st = {ErrorCode::kProtocolError, "oversize shared-memory setup message"};
  } else if (st && !handshake) {
    if ((c.hdr.net_flags & kNetFlagShmPayload) && (!c.shm_in || c.hdr.payload_bytes == 0))
      st = {ErrorCode::kProtocolError,
            "a shared-memory payload on a connection without shared memory"};
    // The authenticated identity, whatever the peer wrote.
    c.hdr.sender = c.peer_id;
    // A posted receive takes the message; otherwise its type needs a handler.
    std::lock_guard lock(c.recv_mu);
    RecvMatch m{c.hdr.type, c.hdr.request_id, c.hdr.key};
    for (auto it = c.posted.begin(); st && it != c.posted.end(); ++it) {
      if (!(it->match == m)) continue;
      c.active = std::move(*it);
      c.posted.erase(it);
      break;
    }
    if (st && !c.active && !handler(c.hdr.type))
      st = {ErrorCode::kProtocolError, fmt::format("unknown message type {}", c.hdr.type)};
  }
  if (!st && handshake && !c.tls &&
      looks_like_tls(reinterpret_cast<const unsigned char*>(c.hdr_bytes.data()), kHeaderBytes))
    st = {ErrorCode::kProtocolError,
          "the peer speaks TLS (PUSHPULL_TLS=1) and this node does not: set PUSHPULL_TLS the same "
          "on every node of the job"};
  if (!st) {
    if (handshake) {
      // Tell the connector why before closing, so both sides log the reason.
      refuse_stranger(c, st.message(), true);
      return;
    }
    PP_ERROR("ProtocolError from {}: {}; closing that connection", c.peer.describe(), st.message());
    close_conn(c, st, true);
    return;
  }
  if (handshake) c.hello_seen = true;
  c.in_payload = true;
  c.shm_payload = !handshake && (c.hdr.net_flags & kNetFlagShmPayload) != 0;
  c.got = 0;
  c.discard = false;
  c.buf.reset();
  c.dst = nullptr;
  if (c.active && c.hdr.payload_bytes <= c.active->capacity)
    c.dst = c.active->dst;
  else
    c.discard = c.active.has_value();
  if (c.hdr.payload_bytes == 0) finish_message(c);
}

// Runs `f` (a handler or completion on the I/O thread); an exception closes
// connection `c` (when given) with a logged error instead of ending the
// process. Returns false when `f` threw.
bool MessageTransport::run_guarded(Conn* c, const char* what, const std::function<void()>& f) {
  std::string error;
  try {
    f();
    return true;
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "unknown exception";
  }
  std::string who = c != nullptr ? c->peer.describe() : std::string("a peer");
  PP_ERROR("{} for {} threw: {}; closing that connection", what, who, error);
  if (c != nullptr)
    close_conn(*c, {ErrorCode::kInternal, fmt::format("{} threw on this node: {}", what, error)},
               true);
  return false;
}

void MessageTransport::finish_message(Conn& c) {
  c.in_payload = false;
  c.shm_payload = false;
  if (c.active) {
    PostedRecv p = std::move(*c.active);
    c.active.reset();
    if (c.discard) {
      Status why{ErrorCode::kProtocolError,
                 fmt::format("message of type {} from {} has {} bytes, more than the {} posted",
                             c.hdr.type, c.peer.describe(), c.hdr.payload_bytes, p.capacity)};
      run_guarded(&c, "a receive completion", [&] { p.done(why, c.hdr); });
    } else {
      run_guarded(&c, "a receive completion", [&] { p.done(Status{}, c.hdr); });
    }
    return;
  }
  if (c.hdr.payload_bytes == 0) c.buf.reset();
  Message m{c.id, c.hdr, std::move(c.buf)};
  if (c.state == Conn::State::kHandshake) return on_hello(c, std::move(m));
  if (c.hdr.type <= msg::kNetLast) return on_shm_setup(c, std::move(m));
  if (auto h = handler(c.hdr.type))
    run_guarded(&c, fmt::format("the handler of message type {}", c.hdr.type).c_str(),
                [&] { (*h)(std::move(m)); });
}

void MessageTransport::release_pending(Conn& c) {
  if (c.pending_source.empty()) return;
  pending_.release(c.pending_source);
  c.pending_source.clear();
}

void MessageTransport::close_conn(Conn& c, const Status& why, bool notify) {
  if (c.state == Conn::State::kClosed) return;
  const bool was_open = c.state == Conn::State::kOpen;
  c.state = Conn::State::kClosed;
  release_pending(c);
  if (c.held) {
    c.held.reset();
    --held_count_;
  }
  std::deque<SendOp> sends;
  std::vector<PostedRecv> recvs;
  {
    std::lock_guard lock(c.send_mu);
    // A refusal ack may still be queued: give it one last non-blocking try.
    std::vector<SendOp> completed;
    write_some(c, completed);
    for (auto& op : completed) {
      --queued_;
      if (op.done) run_guarded(nullptr, "a send completion", [&] { op.done(Status{}); });
    }
    c.closed = true;
    c.close_status = why;
    sends.swap(c.queue);
  }
  {
    std::lock_guard lock(c.recv_mu);
    recvs.swap(c.posted);
  }
  if (c.active) recvs.push_back(std::move(*c.active));
  c.active.reset();
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  ::shutdown(c.fd.get(), SHUT_RDWR);
  settle_shm(c);  // a connect() waiting for the shared-memory setup goes on
  CloseHandler on_close;
  {
    std::lock_guard lock(mu_);
    auto it = conns_.find(c.id);
    if (it != conns_.end()) {
      graveyard_.push_back(it->second);
      conns_.erase(it);
    }
    on_close = on_close_;
  }
  Status failure = why.is_ok() ? Status{ErrorCode::kIoError, "connection closed"} : why;
  Status peer_failure{failure.code(), fmt::format("connection to {} closed: {}", c.peer.describe(),
                                                  failure.message())};
  // Completions and the close handler may throw: log, and go on closing.
  for (auto& op : sends) {
    --queued_;
    if (op.done) run_guarded(nullptr, "a send completion", [&] { op.done(peer_failure); });
  }
  for (auto& r : recvs)
    run_guarded(nullptr, "a receive completion", [&] { r.done(peer_failure, Header{}); });
  if (notify && was_open && on_close)
    run_guarded(nullptr, "the close handler", [&] { on_close(c.id, c.peer, why); });
}

}  // namespace pushpull::transport
