// Direct data streams of a TcpTransport, driven by the thread that runs a
// collective algorithm (no I/O thread, no hand-off per message).
//
// Why: on a host with fewer cores than threads, every hand-off from an I/O
// thread to the algorithm thread is a context switch and a wake-up delay
// (docs/performance.md has the measurements). Here the algorithm thread itself writes to its right
// neighbour and reads from its left one with non-blocking sockets, reading
// payloads straight into place and sleeping in poll() when neither side can
// move (waits block, never spin).
//
// Wire: every message on a stream is a 16-byte header {tag u64, bytes u64,
// little-endian} then the payload. Both ends run the same algorithm, so the
// messages on one directed stream come in the order they were sent; a header
// that is not the expected one is a ProtocolError ("streams out of step").
//
// StreamPump is used by one thread at a time (TcpTransport hands it out under
// its stream lock, see TcpTransport::streams()). Errors throw: PeerFailure
// naming the peer (closed or reset stream), Timeout when nothing moved for
// the progress timeout, the transport's closing reason after close().
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "collective/transport.h"
#include "pushpull/options.h"

// The TcpTransport whose streams an algorithm can use, or nullptr (another
// transport, or streams not set up): algorithms fall back to post_send/recv.

namespace pushpull::collective {

class TcpTransport;
TcpTransport* stream_transport(Transport& t);

class StreamPump {
 public:
  // `what` names the operation in timeout messages.
  StreamPump(TcpTransport& t, Millis progress_timeout, std::string what);

  // Queues a message to `peer` (FIFO per peer). The caller keeps `data`
  // alive and unchanged until finish() returned.
  void send(int peer, uint64_t tag, const void* data, size_t bytes);
  // Queues a receive from `peer` (FIFO per peer); returns its index among
  // this pump's receives from that peer.
  size_t recv(int peer, uint64_t tag, void* dst, size_t bytes);
  // Moves data both ways until receive `index` from `peer` is complete. Reads
  // receives up to index max(index, read_ahead) only, so later receives'
  // destinations (e.g. a reused scratch slot) are not touched yet.
  void wait_recv(int peer, size_t index, size_t read_ahead = 0);
  // Until every queued send is written and every queued receive complete.
  void finish();

 private:
  struct Out {
    unsigned char hdr[16];
    const char* data;
    size_t bytes;
    size_t done = 0;  // of 16 + bytes
  };
  struct In {
    uint64_t tag;
    char* dst;
    size_t bytes;
    unsigned char hdr[16];
    size_t done = 0;
  };
  struct Peer {
    int peer = -1;
    int fd = -1;
    std::deque<Out> out;
    std::vector<In> in;
    size_t in_next = 0;  // first incomplete receive
  };
  Peer& peer(int p);
  // One non-blocking pass each; true when any byte moved. read_some reads
  // receives up to index `last` (inclusive) only.
  bool write_some(Peer& p);
  bool read_some(Peer& p, size_t last);
  void check_header(const Peer& p, const In& in) const;
  // Moves data until done(); `read_peer`/`last`: whose receives to read and
  // up to which index (-1: every peer, all queued receives).
  void progress(int read_peer, size_t last, const std::function<bool()>& done);
  [[noreturn]] void fail(const Peer& p, int err, const char* op) const;

  TcpTransport& t_;
  Millis timeout_;
  std::string what_;
  std::vector<Peer> peers_;  // few: the ring's two neighbours, a partner
};

}  // namespace pushpull::collective
