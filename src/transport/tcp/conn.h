// SPDX-License-Identifier: Apache-2.0
// Internal: one connection's state inside a MessageTransport (see transport.h).
// Receive-side fields belong to the I/O thread; send-side fields are guarded
// by send_mu (user threads write directly when the queue is empty); posted
// receives by recv_mu. The shared-memory fields follow the same split
// (shm/message_transport_shm.cpp; the protocol is in transport/shm/shm_setup.h).
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "transport/hello.h"
#include "transport/shm/shm_segment.h"
#include "transport/tcp/message_transport.h"
#include "transport/tls.h"

namespace pushpull::transport {

struct SendOp {
  // How the payload travels, decided when the header starts going out.
  enum class Path : uint8_t { kUndecided, kTcp, kShm };
  HeaderBytes header;
  const std::byte* data = nullptr;
  size_t len = 0;
  size_t written = 0;  // of header + payload (kTcp); of the header (kShm)
  SendDone done;
  Buffer owned;  // send_copy's payload
  int priority = 0;
  Path path = Path::kUndecided;
  // kShm: payload bytes copied into the ring so far, and the kShmPiece frame
  // announcing the last copy while it is being written.
  size_t shm_copied = 0;
  HeaderBytes piece{};
  size_t piece_written = 0;
  bool piece_pending = false;
  size_t total() const { return kHeaderBytes + len; }
};

// A net-layer frame (shared-memory setup, release) written between messages
// or between the pieces of a shared-memory payload.
struct CtlFrame {
  std::vector<std::byte> bytes;  // header + payload
  size_t written = 0;
  bool release = false;    // a kShmRelease (coalesced while unsent)
  bool activates = false;  // written: this side may send through its ring
};

struct PostedRecv {
  RecvMatch match;
  std::byte* dst = nullptr;
  size_t capacity = 0;
  RecvDone done;
};

// A connection whose hello the acceptor accepted (dial_hello), before it
// becomes a message connection (connect) or a stream (open_stream).
struct MessageTransport::Dialed {
  Fd fd;  // blocking
  std::unique_ptr<TlsLink> tls;
  HelloAck ack;  // accepted, its proof verified
  std::string where;
  std::chrono::steady_clock::time_point hs_deadline;
};

struct MessageTransport::Conn {
  enum class State { kHandshake, kOpen, kClosed };

  ConnId id = 0;
  Fd fd;
  // With PUSHPULL_TLS: every byte on fd goes through this link (transport/tls.h);
  // an accepted connection runs the TLS handshake before the hello.
  std::unique_ptr<TlsLink> tls;
  PeerInfo peer;
  SockAddr remote;  // the socket's remote address (accepted connections)
  // Written by the I/O thread; read by senders too.
  std::atomic<State> state{State::kHandshake};
  // The authenticated peer's node id (transport/node_id.h), written into the
  // sender field of every message delivered from this connection: set at the
  // hello and by bind_peer_rank() (any thread), read by the I/O thread.
  std::atomic<uint32_t> peer_id{0};
  // Acceptor side of the hello (I/O thread only).
  Nonce nonce{};
  std::chrono::steady_clock::time_point handshake_deadline;
  bool hello_seen = false;    // the hello arrived; anything more before the ack is an error
  std::optional<Hello> held;  // a hello waiting until this node has a rank to prove
  // While counted in the MessageTransport's per-source limit of pending
  // connections (transport/peer_policy.h PendingLimit): the source address.
  std::string pending_source;

  // Send side.
  std::mutex send_mu;
  std::deque<SendOp> queue;
  bool want_out = false;
  bool out_armed = false;  // EPOLLOUT is in the epoll set
  bool closed = false;
  Status close_status;
  std::deque<CtlFrame> ctl;
  // Our ring (we write it, the peer reads it) once the peer proved it mapped
  // it; shm_out_ready once the peer knows (so flagged headers follow).
  std::unique_ptr<ShmSegment> shm_out;
  bool shm_out_ready = false;
  uint64_t shm_written = 0;   // stream position of the next byte we copy in
  uint64_t shm_released = 0;  // the peer has consumed up to here
  bool ring_blocked = false;  // the head waits for a release, not for EPOLLOUT

  // The connector's connect() waits (bounded) until the setup settled.
  std::mutex shm_mu;
  std::condition_variable shm_cv;
  bool shm_settled = false;

  // Shared-memory setup and receive side (I/O thread only; the connector
  // sets them before the connection is visible to the I/O thread).
  enum class ShmState { kNone, kOffered, kAnswered, kOn, kOff };
  ShmState shm_state = ShmState::kNone;
  std::unique_ptr<ShmSegment> shm_mine;  // the connector's ring until the answer
  std::unique_ptr<ShmSegment> shm_in;    // the peer's ring, mapped read-only
  uint64_t shm_read = 0;                 // stream position of the next byte we copy out
  uint64_t shm_release_sent = 0;
  bool shm_payload = false;  // the current message's payload comes through shm_in

  // Posted receives.
  std::mutex recv_mu;
  std::vector<PostedRecv> posted;

  // Receive state machine (I/O thread only).
  static constexpr size_t kStaging = 64 << 10;
  std::unique_ptr<std::byte[]> staging{new std::byte[kStaging]};
  size_t st_begin = 0, st_end = 0;
  HeaderBytes hdr_bytes{};
  size_t hdr_got = 0;
  Header hdr;
  bool in_payload = false;
  std::byte* dst = nullptr;
  size_t got = 0;
  // Pooled destination when nothing was posted. It grows as bytes arrive
  // (never sized from the header alone), so a peer that announces a huge
  // payload and sends nothing costs nothing.
  Buffer buf;
  std::optional<PostedRecv> active;  // the posted receive being filled
  bool discard = false;              // payload read then dropped (oversize for its post)

  size_t payload_left() const { return hdr.payload_bytes - got; }
  // recv(2) / sendmsg(2) on fd, non-blocking, through the TLS link when on.
  ssize_t recv_bytes(void* dst, size_t n) {
    return tls ? tls->recv(dst, n) : ::recv(fd.get(), dst, n, MSG_DONTWAIT);
  }
  ssize_t send_iov(iovec* iov, int n) {
    if (tls) return tls->sendv(iov, n);
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = static_cast<size_t>(n);
    return ::sendmsg(fd.get(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  bool tls_handshaking() const { return tls && !tls->established(); }
  bool tls_output_pending() const { return tls && tls->output_pending(); }
  // The payload bytes of the current message follow on the TCP stream.
  bool tcp_payload() const { return in_payload && !shm_payload; }
};

}  // namespace pushpull::transport
