// SPDX-License-Identifier: Apache-2.0
// RAII file descriptors and the socket calls pushpull needs (IPv4 and IPv6):
// socket.cpp; the ports chosen for other programs' listeners
// (pick_unused_port, reserve_port_shared) in ports.cpp.
//
// Ownership: Fd owns one descriptor and closes it in its destructor; it is
// move-only. Thread safety: an Fd is used by one thread at a time (the
// MessageTransport hands it to its I/O thread after the handshake).
// Errors: functions throw IoError / InvalidArgument naming the address,
// except the ones a caller retries or reports on its own terms
// (connect_once, the inherited listener, the blocking handshake I/O), which
// return a Status.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <string>

#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull::transport {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A resolved socket address. Family AF_UNIX stands for the in-process
// medium (transport/inproc/in_process_listeners.h): `in_process_port` is the
// listener's number (0 for the unnamed end of an accepted socketpair).
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  int in_process_port = 0;
  int family() const { return storage.ss_family; }
  // "1.2.3.4:80", "[::1]:80", or "inproc:3" ("inproc" for an accepted end).
  std::string to_string() const;
  int port() const;
};

// Resolves a numeric or named host (IPv4 or IPv6) and a port; the host
// "inproc" gives the in-process medium's address. Throws InvalidArgument
// when the host cannot be resolved.
SockAddr resolve(const std::string& host, int port);
// "host:port" with brackets around IPv6 literals.
std::string format_address(const std::string& host, int port);

// A listening, non-blocking socket bound to host:port (port 0: any free one).
// An empty host binds the IPv4 wildcard address, so other machines can reach
// us. A port another socket holds throws IoError saying "port P is in use (by
// another process)".
Fd listen_on(const std::string& host, int port, int backlog = 512);
// A socket bound to host:port (0: any free one) that does not listen, without
// SO_REUSEADDR: no other socket can bind the port while it lives, and
// connections to it are refused. Throws IoError as listen_on does.
Fd reserve_port(const std::string& host, int port);
// The same with SO_REUSEADDR: a program that binds the port with
// SO_REUSEADDR itself (torch's TCPStore does) can still bind and listen on
// it while this lives, everyone else is kept off (a bind without
// SO_REUSEADDR fails with EADDRINUSE, on any address (an empty host: the
// IPv6 wildcard, dual-stack, where there is IPv6, else 0.0.0.0); the
// kernel, which skips bound ports when it picks one, gives it to no port-0
// bind and to no connect() as a source port).
// For a port whose listener pushpull cannot hand a socket to (a
// torch.distributed store's MASTER_PORT): held from its choice until the job
// ends. Not against a squatter who sets SO_REUSEADDR too and listens first
// (docs/security.md). Throws IoError as listen_on does.
Fd reserve_port_shared(const std::string& host, int port);
// The port a bound socket got.
int local_port(int fd);
// The address of the peer of a connected socket, as "host:port".
std::string peer_address(int fd);

void set_nonblocking(int fd, bool on);
// TCP_NODELAY and SO_SNDBUF/SO_RCVBUF (0: kernel default, autotuning;
// negative: kDefaultSocketBufferBytes).
void tune_socket(int fd, int buffer_bytes);
// A connected socket whose peer stops acknowledging (a link cut without FIN
// or RST, a dead host) fails with ETIMEDOUT after about `timeout`: keepalive
// probes every quarter of it (at least 1 s) once idle, and TCP_USER_TIMEOUT
// for data (and probes) left unacknowledged. A peer that is merely slow or
// stopped still acknowledges (its kernel does). Zero: the kernel's defaults
// (no keepalive; unacknowledged data for many minutes).
void set_dead_link_timeout(int fd, std::chrono::milliseconds timeout);

// NetOptions::socket_buffer_bytes when it is left automatic and nothing
// better is known.
inline constexpr int kDefaultSocketBufferBytes = 128 << 10;
// The automatic buffer of a node that exchanges tensors with `data_peers`
// peers at once (a worker with its servers, a server with its workers and
// backups): 256 KiB in all, split among them, between 32 and 128 KiB per
// connection. Why: those flows share the node's link, and their windows
// together must cover its bandwidth-delay product (256 KiB, doubled by the
// kernel, covers 10-25 Gbit/s at 100 us) without overfilling the switch
// queue in front of it (8 flows of 128 KiB did at 250 Mbit/s: docs/scaling.md).
int auto_socket_buffer_bytes(int data_peers);

// Connects once to `addr`, waiting at most `timeout`: the blocking socket in
// *out, or an error (Timeout, IoError) and *out untouched, so callers can
// retry. A socket connected to itself (is_self_connection) is refused like
// a failed connect.
Status connect_once(const SockAddr& addr, std::chrono::milliseconds timeout, Fd* out);
// Whether a connected socket's peer is the socket itself: a connect() to a
// loopback port in the ephemeral range that nothing listens on can pick that
// port as its source and complete by TCP's simultaneous open.
bool is_self_connection(int fd);

// A TCP port that is free on `host` now, released again before returning:
// RACY, for listeners pushpull cannot hand a socket to (a torch.distributed
// store's MASTER_PORT; worker 0's rendezvous on another host) and for tests.
// Between this call and the listener's bind another local user can take the
// port (denying the job, or, without a secret, posing as the listener): every
// listener pushpull runs itself binds first and publishes the bound port
// instead (listen_on(host, 0)), or is handed the bound socket
// (take_inherited_listener). Preferably below the kernel's ephemeral range,
// so no connect() anywhere on the machine takes it as its source port in the
// meantime; the kernel's choice otherwise. Throws IoError when no port can be
// bound.
int pick_unused_port(const std::string& host);

// The environment variable naming a listening socket a process inherited
// from `pushpull launch` (internal: set by the launcher for one child only,
// worker 0 of a `-s 0` job, whose rendezvous port it bound and held).
inline constexpr const char* kListenFdVariable = "PUSHPULL_LISTEN_FD";

// Adopts the inherited listening socket named by `value` (a decimal fd) when
// it is a listening TCP socket bound to `port` (any port when `port` is 0):
// *out gets it close-on-exec and non-blocking. Otherwise an error saying why
// (NotFound: `value` is null or empty; InvalidArgument: the descriptor is
// not such a socket), the fd left untouched (it is not ours).
Status adopt_inherited_listener(const char* value, int port, Fd* out);
// adopt_inherited_listener() with `inherited` (NetOptions::inherited_listener,
// from PUSHPULL_LISTEN_FD), at most once per process (the first success owns
// the fd; later calls get NotFound).
Status take_inherited_listener(int port, const std::string& inherited, Fd* out);

// Blocking full-buffer I/O with a deadline (handshakes only): Timeout at the
// deadline, IoError on EOF ("connection closed by the peer") or an error.
Status write_all(int fd, const void* data, size_t n,
                 std::chrono::steady_clock::time_point deadline);
Status read_all(int fd, void* data, size_t n, std::chrono::steady_clock::time_point deadline);

}  // namespace pushpull::transport
