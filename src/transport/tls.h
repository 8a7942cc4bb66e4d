// SPDX-License-Identifier: Apache-2.0
// Optional encryption on the wire (PUSHPULL_TLS=1, docs/security.md "TLS"):
// TLS 1.3 with an external pre-shared key derived from the job secret
// (RFC 8446 section 2.2, psk_dhe_ke: the key authenticates both ends, an
// ephemeral X25519 exchange gives forward secrecy), TLS_AES_128_GCM_SHA256,
// no certificates and no session tickets. OpenSSL's libssl does the protocol;
// this file only feeds it sockets.
//
// TlsLink wraps one connected non-blocking socket and offers the calls the
// transports make on plain sockets, with the same non-blocking contract
// (bytes moved, 0 at the peer's end of stream, -1 with errno, EAGAIN when
// nothing can move now):
//   - readv()/recv() decrypt records read straight from the socket;
//   - sendv() encrypts the plaintext it takes into a bounded backlog of
//     ciphertext and writes as much of it as the socket accepts. Bytes it
//     reports taken are committed: later sendv() or flush() calls send them
//     in order. So the caller must keep flushing while output_pending()
//     (wait for POLLOUT / EPOLLOUT), even when it has nothing more to send.
// Readiness: a socket can be empty while the link still holds received
// records (input_buffered()); a caller that stops reading before EAGAIN must
// come back without waiting for the socket.
//
// Thread safety: every method takes the link's mutex, so one thread may read
// while another writes (the collectives' reader and writer threads); calls
// never block on the socket. Ownership: the link does not own the socket;
// its owner closes it after destroying the link (or with it alive: the link
// only keeps the number). TlsContext is immutable and shared.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <array>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/options.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace pushpull::transport {

class TlsContext {
 public:
  // Key: HMAC-SHA256(secret, "pushpull tls 1.3 psk v1" || job_id). Throws
  // InvalidArgument for an empty secret, Internal when libssl fails.
  TlsContext(const std::string& job_id, const std::string& secret);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  SSL_CTX* client() const { return client_; }
  SSL_CTX* server() const { return server_; }
  const std::array<unsigned char, 32>& key() const { return key_; }

 private:
  std::array<unsigned char, 32> key_{};
  SSL_CTX* client_ = nullptr;
  SSL_CTX* server_ = nullptr;
};

// The context for these options: nullptr when TLS is off; one shared
// context per (job id, secret) in the process. Throws InvalidArgument when
// TLS is on without a job secret (PUSHPULL_ALLOW_INSECURE=1 with PUSHPULL_TLS=1).
std::shared_ptr<const TlsContext> tls_context(const NetOptions& net);

class TlsLink {
 public:
  enum class Side { kClient, kServer };
  enum class Step { kDone, kWaiting, kFailed };

  TlsLink(std::shared_ptr<const TlsContext> ctx, int fd, Side side);
  ~TlsLink();
  TlsLink(const TlsLink&) = delete;
  TlsLink& operator=(const TlsLink&) = delete;

  // One non-blocking step of the handshake. kWaiting: wait for the socket to
  // be readable, or writable while output_pending(). kFailed: error() says why.
  Step handshake();
  bool established() const;
  // The handshake failed on the protocol (another key, not TLS), not on I/O.
  bool refused() const;
  std::string error() const;

  ssize_t readv(const iovec* iov, int count);
  ssize_t recv(void* dst, size_t n);
  ssize_t sendv(const iovec* iov, int count);
  ssize_t send(const void* data, size_t n);
  // Writes pending ciphertext: 1 when none is left, 0 when the socket is
  // full, -1 on an error (errno).
  int flush();
  bool output_pending() const;
  bool input_buffered() const;
  int fd() const { return fd_; }

 private:
  int flush_locked();
  bool write_record(const void* data, size_t n);
  ssize_t fail_io(int ssl_error, size_t moved, const char* op);

  friend struct TlsSink;
  std::shared_ptr<const TlsContext> ctx_;
  int fd_;
  SSL* ssl_ = nullptr;
  mutable std::mutex mu_;
  bool established_ = false;
  bool refused_ = false;
  std::string error_;
  std::vector<unsigned char> out_;  // ciphertext not yet written
  size_t out_off_ = 0;
  std::vector<unsigned char> gather_;  // small pieces coalesced into one record
};

// Blocking helpers bounded by `deadline` (the connectors' side): run the
// handshake to its end, write every byte and flush, read exactly n bytes.
// Errors: Timeout at the deadline; ProtocolError when the peer refused the
// handshake (TlsLink::refused(): a wrong key, not TLS); IoError otherwise.
Status tls_handshake(TlsLink& link, std::chrono::steady_clock::time_point deadline);
Status tls_write_all(TlsLink& link, const void* data, size_t n,
                     std::chrono::steady_clock::time_point deadline);
Status tls_read_all(TlsLink& link, void* data, size_t n,
                    std::chrono::steady_clock::time_point deadline);

// The first bytes of a TLS ClientHello record, for telling a plain node
// that its peer runs with PUSHPULL_TLS=1.
bool looks_like_tls(const unsigned char* bytes, size_t n);

}  // namespace pushpull::transport
