// SPDX-License-Identifier: Apache-2.0
// MessageTransport: setup, send and post_recv. Connecting (the connector's side
// of the hello) is in message_transport_connect.cpp, the epoll loop in
// message_transport_loop.cpp.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "pushpull/log.h"
#include "transport/address.h"
#include "transport/host_identity.h"
#include "transport/inproc/in_process_listeners.h"
#include "transport/shm/shm_setup.h"
#include "transport/tcp/conn.h"

namespace pushpull::transport {

std::string PeerInfo::describe() const {
  std::string who = role == Role::kNone ? std::string("unregistered node")
                    : rank < 0          ? std::string(role_name(role))
                                        : fmt::format("{} {}", role_name(role), rank);
  std::string where = port > 0 ? format_address(host, port) : address;
  return fmt::format("{} (host {})", who, where);
}

MessageTransport::MessageTransport(TransportConfig config)
    : config_(std::move(config)),
      pool_(8, /*lending=*/config_.lend_buffers),
      role_(config_.role),
      rank_(config_.rank) {
  epoll_fd_ = Fd(epoll_create1(EPOLL_CLOEXEC));
  wake_fd_ = Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_fd_.valid() || !wake_fd_.valid())
    throw IoError(fmt::format("cannot create epoll/eventfd: {}", std::strerror(errno)));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // nullptr = the wake fd; &listen_fd_ = the listener
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev);
  tls_ = tls_context(config_.net);
}

MessageTransport::~MessageTransport() {
  stop();
}

int MessageTransport::listen(const std::string& host, int port) {
  if (!is_in_process_host(host)) return listen(listen_on(host, port));
  warn_insecure_once(config_.net);
  // The in-process medium: no socket; dialers' ends of their socketpairs
  // arrive through adopted_ (accept_adopted on the I/O thread).
  port_ = in_process::add(port, [this](Fd fd) {
    {
      std::lock_guard lock(mu_);
      adopted_.push_back(std::move(fd));
    }
    wake();
  });
  in_process_ = true;
  return port_;
}

int MessageTransport::listen(Fd listening) {
  warn_insecure_once(config_.net);
  set_nonblocking(listening.get(), true);
  listen_fd_ = std::move(listening);
  port_ = local_port(listen_fd_.get());
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &listen_fd_;
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev);
  return port_;
}

void MessageTransport::set_handler(uint16_t first, uint16_t last, Handler handler) {
  if (first > last || last > 255 || first <= msg::kNetLast)
    throw InvalidArgument(
        fmt::format("handler range [{}, {}] is invalid: upper layers own "
                    "types 16..255",
                    first, last));
  auto h = std::make_shared<Handler>(std::move(handler));
  std::lock_guard lock(mu_);
  for (int t = first; t <= last; ++t)
    handlers_[t] = h;
}

void MessageTransport::set_connect_handler(ConnectHandler h) {
  std::lock_guard lock(mu_);
  on_connect_ = std::move(h);
}
void MessageTransport::set_close_handler(CloseHandler h) {
  std::lock_guard lock(mu_);
  on_close_ = std::move(h);
}
void MessageTransport::set_identity(Role role, int32_t rank, uint32_t sender_id) {
  {
    std::lock_guard lock(mu_);
    role_ = role;
    rank_ = rank;
    sender_ = sender_id;
  }
  wake();  // held hellos may be answered now
}
void MessageTransport::set_advertised_address(const std::string& host, int port) {
  std::lock_guard lock(mu_);
  adv_host_ = host;
  adv_port_ = port;
}

void MessageTransport::start() {
  if (started_) return;
  started_ = true;
  // Segment names left on this host by processes killed mid-setup.
  if (config_.shared_memory)
    ShmSegment::sweep_stale(config_.shm_dir, kShmStaleAfter, kShmOrphanAfter);
  thread_ = std::thread([this] {
    ScopedLogContext ctx(config_.label);
    loop();
  });
}

void MessageTransport::stop() {
  if (stopping_.exchange(true)) {
    if (thread_.joinable()) thread_.join();
    return;
  }
  // No dialer reaches this transport after this returns (in-process medium).
  if (in_process_) in_process::remove(port_);
  wake();
  {
    std::lock_guard lock(streams_mu_);  // take_stream() waiters see stopping_
    streams_in_.clear();
  }
  streams_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The loop closed what it saw; close what is left (never started, or
  // connections added after the loop ended).
  std::unordered_map<ConnId, std::shared_ptr<Conn>> left;
  std::vector<Fd> unserved;  // in-process dialers' ends the loop never took: they see EOF now
  {
    std::lock_guard lock(mu_);
    left.swap(conns_);
    unserved.swap(adopted_);
  }
  for (auto& [id, c] : left)
    close_conn(*c, {ErrorCode::kIoError, "transport stopped"}, false);
}

void MessageTransport::wake() {
  uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_fd_.get(), &one, sizeof one);
}

void MessageTransport::set_socket_buffer(ConnId id, int bytes) {
  auto c = find(id);
  if (!c || bytes <= 0 || !c->fd.valid()) return;
  setsockopt(c->fd.get(), SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  setsockopt(c->fd.get(), SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

int MessageTransport::socket_receive_buffer(ConnId id) const {
  auto c = find(id);
  int bytes = 0;
  socklen_t len = sizeof bytes;
  if (!c || !c->fd.valid() || getsockopt(c->fd.get(), SOL_SOCKET, SO_RCVBUF, &bytes, &len) != 0)
    return 0;
  return bytes;
}

std::shared_ptr<MessageTransport::Conn> MessageTransport::find(ConnId id) const {
  std::lock_guard lock(mu_);
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second;
}

std::shared_ptr<Handler> MessageTransport::handler(uint16_t type) const {
  if (type > 255) return nullptr;
  std::lock_guard lock(mu_);
  return handlers_[type];
}

std::optional<PeerInfo> MessageTransport::peer(ConnId conn) const {
  std::lock_guard lock(mu_);
  auto it = conns_.find(conn);
  if (it == conns_.end()) return std::nullopt;
  return it->second->peer;
}

bool MessageTransport::bind_peer_rank(ConnId conn, int32_t rank) {
  std::lock_guard lock(mu_);
  auto it = conns_.find(conn);
  if (it == conns_.end() || rank < 0) return false;
  Conn& c = *it->second;
  if (c.peer.rank >= 0) return c.peer.rank == rank;
  c.peer.rank = rank;
  c.peer_id = node_id(c.peer.role, rank);
  return true;
}

std::vector<ConnId> MessageTransport::connections() const {
  std::lock_guard lock(mu_);
  std::vector<ConnId> ids;
  for (auto& [id, c] : conns_)
    ids.push_back(id);
  return ids;
}

Header MessageTransport::stamp(Header h, size_t n) const {
  h.magic = kMagic;
  h.version = config_.protocol_version;
  h.payload_bytes = n;
  std::lock_guard lock(mu_);
  h.sender = sender_;
  return h;
}

ConnId MessageTransport::add_conn(std::shared_ptr<Conn> c) {
  std::lock_guard lock(mu_);
  c->id = next_id_++;
  conns_[c->id] = c;
  return c->id;
}

void MessageTransport::enqueue(Conn& c, SendOp&& op, bool from_io_thread) {
  (void)from_io_thread;
  std::vector<SendOp> completed;
  Status failed;
  {
    std::unique_lock lock(c.send_mu);
    if (c.closed) {
      failed = c.close_status;
    } else {
      ++queued_;
      // Keep priority order behind the head (which may be partly written).
      auto it = c.queue.end();
      while (it != c.queue.begin() && std::prev(it) != c.queue.begin() &&
             std::prev(it)->priority < op.priority)
        --it;
      if (it == c.queue.begin() && !c.queue.empty()) ++it;
      c.queue.insert(it, std::move(op));
      // Nothing in flight: write on this thread now; the I/O thread finishes
      // whatever the socket (or the ring) does not take. On an error the I/O
      // thread sees it (EPOLLOUT) and closes.
      if (!c.want_out) after_write(c, write_some(c, completed));
    }
  }
  if (!failed.is_ok()) {
    if (op.done) op.done(failed);
    return;
  }
  complete_sends(nullptr, completed);
}

void MessageTransport::send(ConnId conn, Header header, const void* data, size_t n, SendDone done,
                            int priority) {
  auto c = find(conn);
  if (!c || c->state == Conn::State::kHandshake) {
    if (done) done({ErrorCode::kIoError, fmt::format("connection {} is closed", conn)});
    return;
  }
  SendOp op;
  op.header = encode_header(stamp(header, n));
  op.data = static_cast<const std::byte*>(data);
  op.len = n;
  op.done = std::move(done);
  op.priority = priority;
  enqueue(*c, std::move(op), false);
}

Status MessageTransport::send_copy(ConnId conn, Header header, const void* data, size_t n,
                                   int priority) {
  auto c = find(conn);
  if (!c) return {ErrorCode::kIoError, fmt::format("connection {} is closed", conn)};
  SendOp op;
  op.header = encode_header(stamp(header, n));
  op.owned = pool_.acquire(n);
  if (n > 0) std::memcpy(op.owned.data(), data, n);
  op.data = op.owned.data();
  op.len = n;
  op.priority = priority;
  Status result;
  op.done = nullptr;
  {
    std::lock_guard lock(c->send_mu);
    if (c->closed) return c->close_status;
  }
  enqueue(*c, std::move(op), false);
  return result;
}

Status MessageTransport::post_recv(ConnId conn, RecvMatch match, void* dst, size_t capacity,
                                   RecvDone done) {
  auto c = find(conn);
  if (!c) return {ErrorCode::kIoError, fmt::format("connection {} is closed", conn)};
  std::lock_guard lock(c->recv_mu);
  {
    std::lock_guard slock(c->send_mu);
    if (c->closed) return c->close_status;
  }
  for (auto& p : c->posted)
    if (p.match == match)
      return {ErrorCode::kInvalidArgument,
              fmt::format("a receive for type {} request {} key {} is already posted", match.type,
                          match.request_id, match.key)};
  c->posted.push_back({match, static_cast<std::byte*>(dst), capacity, std::move(done)});
  return {};
}

bool MessageTransport::cancel_recv(ConnId conn, RecvMatch match) {
  auto c = find(conn);
  if (!c) return false;
  std::lock_guard lock(c->recv_mu);
  for (auto it = c->posted.begin(); it != c->posted.end(); ++it)
    if (it->match == match) {
      c->posted.erase(it);
      return true;
    }
  return false;
}

void MessageTransport::close(ConnId conn, Status reason) {
  {
    std::lock_guard lock(mu_);
    to_close_.emplace_back(conn, std::move(reason));
  }
  wake();
}

bool MessageTransport::drain(Millis timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (queued_.load() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(Millis{2});
  }
  return true;
}

}  // namespace pushpull::transport
