// SPDX-License-Identifier: Apache-2.0
// Internal: one connection's state inside a Transport (see transport.h).
// Receive-side fields belong to the I/O thread; send-side fields are guarded
// by send_mu (user threads write directly when the queue is empty); posted
// receives by recv_mu.
#pragma once

#include <atomic>
#include <deque>
#include <mutex>
#include <optional>

#include "net/hello.h"
#include "net/transport.h"

namespace pushpull::net {

struct SendOp {
  HeaderBytes header;
  const std::byte* data = nullptr;
  size_t len = 0;
  size_t written = 0;  // of header + payload
  SendDone done;
  Buffer owned;  // send_copy's payload
  int priority = 0;
  size_t total() const { return kHeaderBytes + len; }
};

struct PostedRecv {
  RecvMatch match;
  std::byte* dst = nullptr;
  size_t capacity = 0;
  RecvDone done;
};

struct Transport::Conn {
  enum class State { kHandshake, kOpen, kClosed };

  ConnId id = 0;
  Fd fd;
  PeerInfo peer;
  SockAddr remote;  // the socket's remote address (accepted connections)
  // Written by the I/O thread; read by senders too.
  std::atomic<State> state{State::kHandshake};
  // The authenticated peer's node id (net/node_id.h), written into the
  // sender field of every message delivered from this connection: set at the
  // hello and by bind_peer_rank() (any thread), read by the I/O thread.
  std::atomic<uint32_t> peer_id{0};
  // Acceptor side of the hello (I/O thread only).
  Nonce nonce{};
  std::chrono::steady_clock::time_point handshake_deadline;
  bool hello_seen = false;    // the hello arrived; anything more before the ack is an error
  std::optional<Hello> held;  // a hello waiting until this node has a rank to prove

  // Send side.
  std::mutex send_mu;
  std::deque<SendOp> queue;
  bool want_out = false;
  bool closed = false;
  Status close_status;

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
};

}  // namespace pushpull::net
