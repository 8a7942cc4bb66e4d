// SPDX-License-Identifier: Apache-2.0
// The in-process medium of MessageTransport: nodes that live in one process
// (InProcessJob, tests) connect without TCP/IP and without a port anyone else
// could reach. A MessageTransport that listens on host "inproc" registers
// here under a number that stands for its port; a connect to "inproc:N"
// (resolve() gives an AF_UNIX SockAddr carrying N, connect_once() calls
// dial()) makes a socketpair(AF_UNIX) and hands one end to that listener as
// an accepted connection. Everything above the socket is the TCP path's: the
// challenge, the hello (its proofs, the job secret, TLS when on), the
// framing, posted receives, liveness, the same-host shared memory.
//
// The registry is process-wide (that is its point: a listener and its
// dialers know each other only by the number) and holds no socket: nothing
// outside this process can connect. Numbers are given out from 1 up,
// wrapping within 1..65535 (address books carry them as TCP ports) and
// skipping those in use; a listener asking for one in use is refused.
//
// Thread safety: every function is thread-safe. The accept callback runs
// under the registry's lock, on the dialer's thread: it must only queue the
// descriptor and return (MessageTransport wakes its I/O thread). remove()
// returns only once no callback of that listener runs, so its owner may be
// destroyed after it. Ownership: the registry owns the callbacks; the
// descriptors handed to them are theirs.
#pragma once

#include <functional>
#include <string_view>

#include "pushpull/error.h"
#include "transport/socket.h"

namespace pushpull::transport {

// The host name that selects the in-process medium.
inline constexpr std::string_view kInProcessHost = "inproc";
inline bool is_in_process_host(std::string_view host) {
  return host == kInProcessHost;
}

namespace in_process {

using AcceptFn = std::function<void(Fd)>;

// Registers a listener under `port` (0: the next free number) and returns
// the number. Throws IoError when `port` is taken.
int add(int port, AcceptFn accept);
// Unregisters `port` (nothing when absent).
void remove(int port);
// Connects to the listener registered under `port`: *out gets this end of a
// fresh socketpair (blocking, close-on-exec), the listener the other (non-
// blocking). An IoError when nobody is registered there (saying the medium
// reaches this process only), so connect() retries until its deadline as it
// does for a refused TCP connection.
Status dial(int port, Fd* out);

}  // namespace in_process
}  // namespace pushpull::transport
