// SPDX-License-Identifier: Apache-2.0
// Who may connect, where to listen, and how refusals are logged.
//
// Without a job secret nothing authenticates a peer, so a node accepts
// peers on this machine only (127.0.0.0/8, ::1, its own interface
// addresses), and dials peers on this machine only too (a proof of all
// zeros back from another host proves nothing: whoever answers at a
// rendezvous address would become rank 0), and says so once, unless
// NetOptions::allow_insecure (PUSHPULL_ALLOW_INSECURE=1). Options::from_env()
// leaves the secret empty only with allow_insecure (src/base/secret_file.h),
// so this rule matters for Options built in code. A node listens on
// the address it advertises, never on every address unless asked
// (NetOptions::bind_any / PUSHPULL_BIND_ANY=1, or a wildcard advertised host).
//
// Thread safety: the free functions are pure (warn_insecure_once() logs once
// per process, from any thread). RefusalLog is used by one thread (a
// MessageTransport's I/O thread, or one setup routine).
#pragma once

#include <chrono>
#include <string>
#include <unordered_map>
#include <vector>

#include "pushpull/options.h"
#include "transport/socket.h"

namespace pushpull::transport {

// 127.0.0.0/8, ::1, IPv4-mapped ::ffff:127.0.0.0/104, and the in-process
// medium (AF_UNIX socketpairs: this very process).
bool is_loopback(const SockAddr& a);
// The address without its port ("10.0.0.2", "::1", "inproc"), for logs and
// rate limits.
std::string host_of(const SockAddr& a);

// Ok when a peer at `peer` may go on to authenticate, else a ProtocolError
// saying why not (sent to the peer in the hello ack and logged).
// `local_hosts` are this machine's own addresses (list_interfaces()): a
// connection from one of them comes from this machine too (a node that
// advertises its LAN address connects from it).
Status peer_refusal(const SockAddr& peer, const NetOptions& opts,
                    const std::vector<std::string>& local_hosts = {});
// The same rule for a connection this node opened: ok when it may use the
// connection to `peer`, else a ProtocolError saying why not (the dial
// fails with it).
Status dial_refusal(const SockAddr& peer, const NetOptions& opts,
                    const std::vector<std::string>& local_hosts = {});
// Loopback, or one of `local_hosts` (IPv4-mapped addresses unwrapped).
bool is_local_peer(const SockAddr& peer, const std::vector<std::string>& local_hosts);

// How many unauthenticated connections one source address of another
// machine may hold at once in a node's handshake: a stranger's flood from
// one address cannot take every descriptor, and one source cannot starve
// the others. This machine's own addresses are not capped: the job's own
// nodes share them (a cap would let any local user lock them out), and a
// local user could use any of 127.0.0.0/8 anyway; the descriptor-limit
// pause of the accept loop bounds them.
inline constexpr size_t kMaxPendingPerSource = 64;

// Counts pending (unauthenticated) connections per source address. admit()
// counts one more unless `limit` are pending from that address (then the
// caller closes the connection at once); release() forgets one.
// Thread safety: one thread (the I/O thread, or one setup routine).
class PendingLimit {
 public:
  explicit PendingLimit(size_t limit = kMaxPendingPerSource) : limit_(limit) {}
  bool admit(const std::string& host);
  void release(const std::string& host);
  size_t pending(const std::string& host) const;
  size_t limit() const { return limit_; }

 private:
  size_t limit_;
  std::unordered_map<std::string, size_t> count_;
};
// The one loud warning of a node without a secret (once per process).
void warn_insecure_once(const NetOptions& opts);

// Where to listen to serve the advertised `host`: a wildcard ("" for IPv4,
// "::" for IPv6) when `bind_any` or `host` is empty, "0.0.0.0" or "::";
// "localhost" binds 127.0.0.1; any other host binds itself.
std::string bind_host_for(const std::string& host, bool bind_any);

// Logs refused or failed unauthenticated connections: at most one line per
// peer address per `interval`, the next line saying how many were not logged.
class RefusalLog {
 public:
  explicit RefusalLog(std::chrono::milliseconds interval = std::chrono::seconds(5))
      : interval_(interval) {}
  void note(const std::string& peer_host, const std::string& message);

 private:
  struct Entry {
    std::chrono::steady_clock::time_point last;
    uint64_t suppressed = 0;
  };
  std::chrono::milliseconds interval_;
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace pushpull::transport
