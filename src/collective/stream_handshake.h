// SPDX-License-Identifier: Apache-2.0
// The handshake of the collectives' direct data streams (tcp_streams.h),
// with the same proof as the net hello (net/hello.h compute_proof):
//
//   acceptor  -> connector  acceptor nonce (32 bytes)
//   connector -> acceptor   rank (u64 LE), connector nonce (32), connector proof (32)
//   acceptor  -> connector  acceptor proof (32)
//
// The proof key is the job secret followed by a random per-listener token
// that the acceptor sent to the connecting rank over the authenticated net
// connection, so without a job secret only members that were told the token
// can take a stream. Both sides prove (as worker <rank>), so neither a
// stranger nor a member claiming another rank gets a stream.
//
// accept_streams() serves every pending connection at once, each with its own
// deadline, so a silent or slow connection to the port cannot make a real
// rank miss its deadline; a failed or timed-out connection is dropped and
// logged (rate-limited) and never fails the group. At most
// net::kMaxPendingPerSource connections from one address are pending at
// once; more are closed at once (connect_stream retries those).
//
// With TLS (NetOptions::tls, net/tls.h) each stream runs the TLS handshake
// first (the acceptor serves those concurrently too, under the same
// deadlines) and everything above, the proofs included, goes through it.
//
// Thread safety: free functions; each call uses only its own sockets.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collective/transport.h"
#include "net/hello.h"
#include "net/socket.h"
#include "net/tls.h"

namespace pushpull::collective {

struct StreamAuth {
  std::string job_id;
  std::string job_secret;
  net::Nonce token{};  // the acceptor's listener token
  // No job secret and not PUSHPULL_ALLOW_INSECURE (net/peer_policy.h): streams
  // are accepted from, and opened to, addresses of this machine only.
  bool local_only = false;
  std::shared_ptr<const net::TlsContext> tls;  // null: plain TCP
  std::string key() const;
};

// The connector's hello: rank (u64 LE), nonce, proof.
inline constexpr size_t kStreamHelloBytes =
    8 + std::tuple_size_v<net::Nonce> + std::tuple_size_v<net::Proof>;

// The acceptor's check of a connector's hello (sans-IO, fuzzed by
// tests/fuzz/fuzz_stream_hello.cpp): `rank` >= 0 and the acceptor's proof to
// send back when the connector proved a rank in (rank, size) that is not
// `taken`; else rank -1 and why.
struct StreamHelloCheck {
  int rank = -1;
  std::string refusal;
  net::Proof answer{};
};
StreamHelloCheck check_stream_hello(std::span<const std::byte, kStreamHelloBytes> hello,
                                    const StreamAuth& auth, const net::Nonce& nonce, int rank,
                                    int size, const std::vector<bool>& taken);

// One data stream: the socket, and its TLS link when TLS is on.
struct Stream {
  net::Fd fd;
  std::unique_ptr<net::TlsLink> tls;
};

// Accepts one stream from each rank in (rank, size) on the non-blocking
// listening socket `listener`. Returns the sockets by rank (invalid below and
// at `rank`). Throws Timeout naming the missing ranks at `deadline`.
// `abandon`, when given, is asked every 100 ms: a status it returns (a peer's
// failure, known from elsewhere) ends the wait at once and is thrown.
std::vector<Stream> accept_streams(int listener, const StreamAuth& auth, int rank, int size,
                                   Clock::time_point deadline, Millis handshake_timeout,
                                   const std::string& what,
                                   const std::function<std::optional<Status>()>& abandon = {});
// The same for the ranks q > rank with expected[q] only (size =
// expected.size()); a connector claiming any other rank is refused.
std::vector<Stream> accept_streams(int listener, const StreamAuth& auth, int rank,
                                   const std::vector<bool>& expected, Clock::time_point deadline,
                                   Millis handshake_timeout, const std::string& what,
                                   const std::function<std::optional<Status>()>& abandon = {});

// Opens the stream from `rank` to `peer` at host:port. Throws IoError when
// the connection or the handshake fails, ProtocolError when the acceptor
// does not prove it is `peer`.
Stream connect_stream(const std::string& host, int port, const StreamAuth& auth, int rank, int peer,
                      Clock::time_point deadline, const std::string& what);

}  // namespace pushpull::collective
