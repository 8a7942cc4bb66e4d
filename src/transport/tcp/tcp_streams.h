// SPDX-License-Identifier: Apache-2.0
// Direct data streams of a TcpTransport, driven by the thread that runs a
// collective's schedule (no I/O thread, no hand-off per message).
//
// Why: on a host with fewer cores than threads, every hand-off from an I/O
// thread to the algorithm thread is a context switch and a wake-up delay
// (docs/performance.md has the measurements). Here the algorithm thread itself writes to its right
// neighbour and reads from its left one with non-blocking sockets, reading
// payloads straight into place and sleeping in poll() when neither side can
// move (waits block, never spin).
//
// Wire: every message on a stream is net's 64-byte header (transport/message.h:
// type msg::kStreamData, request_id = the tag, payload_bytes = the size)
// then the payload; the streams are net connections handed over after the
// one hello (transport/tcp/message_transport.h, "Streams"). Both ends run the same algorithm,
// so the messages on one directed stream come in the order they were sent;
// a header that decode_header() refuses, or that is not the expected one, is
// a ProtocolError ("streams out of step").
//
// StreamPump is used by one thread at a time (the one holding the
// transport's stream lock, DirectStreams::lock_streams()). Errors throw: PeerFailure
// naming the peer (closed or reset stream), Timeout when nothing moved for
// the progress timeout, the transport's closing reason after close().
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pushpull/options.h"
#include "transport/message.h"
#include "transport/tls.h"
#include "transport/transport.h"
#include "transport/worker_thread.h"

namespace pushpull::transport {

// Streams to the peers as non-blocking file descriptors, for one operation at
// a time (lock_streams()), and two threads living as long as the transport
// that large operations hand their sending and receiving to. The TCP
// transport's face for the code below (tcp_transport.h).
class DirectStreams {
 public:
  virtual ~DirectStreams() = default;
  virtual int rank() const = 0;
  // -1 when there is no stream to `peer`.
  virtual int stream_fd(int peer) const = 0;
  // The stream's TLS link (PUSHPULL_TLS), through which every byte on
  // stream_fd(peer) must go; nullptr for plain TCP. It lives as long as the
  // stream; its own lock lets one thread read while another writes.
  virtual transport::TlsLink* stream_tls(int /*peer*/) const { return nullptr; }
  // Held by an operation for the whole of its use of the streams.
  virtual std::unique_lock<std::mutex> lock_streams() = 0;
  // True once closed or failed (stream waits end then).
  virtual bool is_closed() const = 0;
  // The error to report for a failed stream operation with `peer`: the
  // transport's closing reason or verdict when there is one, else `code`
  // naming the peer and `why`. Called by the thread that drives the streams.
  virtual Status stream_error(int peer, const std::string& why,
                              ErrorCode code = ErrorCode::kPeerFailure) = 0;
  // Used under lock_streams() only.
  virtual WorkerThread& writer_thread() = 0;
  virtual WorkerThread& reader_thread() = 0;
};

// Runs `s` (schedule.h) on the streams from the calling thread, under
// lock_streams() (tcp_streams_run.cpp). Every peer of `s` must have a
// stream (InvalidArgument otherwise). Errors throw, as StreamPump's.
void run_on_streams(DirectStreams& t, const Schedule& s);

class StreamPump {
 public:
  // `what` names the operation in timeout messages.
  StreamPump(DirectStreams& t, Millis progress_timeout, std::string what);

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
  // Until every queued send is written (none read).
  void wait_sent();
  // Also wait on `fd` (readable = something to check) and run `check` (which
  // throws to abort) on every turn: a StreamWriter's failure stops the reads.
  // May be called several times (every fd is watched, every check runs).
  void watch(int fd, std::function<void()> check) {
    watch_fds_.push_back(fd);
    checks_.push_back(std::move(check));
  }

 private:
  struct Out {
    transport::HeaderBytes hdr;
    const char* data;
    size_t bytes;
    size_t done = 0;  // of transport::kHeaderBytes + bytes
  };
  struct In {
    uint64_t tag;
    char* dst;
    size_t bytes;
    transport::HeaderBytes hdr;
    size_t done = 0;
  };
  struct Peer {
    int peer = -1;
    int fd = -1;
    transport::TlsLink* tls = nullptr;  // with TLS: every byte goes through it
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
  // up to which index (-1: every peer, all queued receives; -2: none).
  void progress(int read_peer, size_t last, const std::function<bool()>& done);
  [[noreturn]] void fail(const Peer& p, int err, const char* op) const;

  DirectStreams& t_;
  Millis timeout_;
  std::string what_;
  std::vector<Peer> peers_;  // few: the ring's two neighbours, a partner
  std::vector<int> watch_fds_;
  std::vector<std::function<void()>> checks_;
};

// A thread writing an ordered list of messages to one peer while the caller
// reads and reduces (large ring operations): sending overlaps with receiving
// and reducing even when a rank gets a core of its own, and the kernel's
// send-side copy no longer waits behind the reduction. Message i goes out
// once the caller has release()d it.
//
// The sending runs on the transport's writer thread (DirectStreams::
// writer_thread(), one per transport, not one per operation). The caller
// keeps every message's data alive until finish() returned or the writer was
// destroyed; destroying an unfinished writer stops it (its stream is shut
// down: a half-written message would put the peers out of step) and waits
// for the thread to let go of it. Errors: finish() throws the writer's error (PeerFailure,
// Timeout after `progress_timeout` without progress).
class StreamWriter {
 public:
  struct Msg {
    uint64_t tag;
    const void* data;
    size_t bytes;
  };
  StreamWriter(DirectStreams& t, int peer, std::vector<Msg> msgs, Millis progress_timeout,
               std::string what);
  ~StreamWriter();
  StreamWriter(const StreamWriter&) = delete;
  StreamWriter& operator=(const StreamWriter&) = delete;

  // Messages [0, count) may be sent (monotonic).
  void release(size_t count);
  // Blocks until every message is written; throws the writer's error.
  void finish();
  // Readable once the writer failed; check() then throws its error.
  int error_fd() const { return error_fd_; }
  void check();

 private:
  void run();
  Status write_all_released(size_t& next, size_t& offset, size_t released);

  DirectStreams& t_;
  int peer_, fd_;
  transport::TlsLink* tls_;  // the stream's TLS link, or nullptr
  std::vector<Msg> msgs_;
  std::vector<transport::HeaderBytes> hdrs_;
  Millis timeout_;
  std::string what_;
  int wake_fd_ = -1;   // eventfd: wakes the thread's poll() on abort
  int error_fd_ = -1;  // eventfd: signalled when the thread failed

  std::mutex mu_;
  std::condition_variable cv_;
  size_t released_ = 0;
  bool abort_ = false, done_ = false;
  Status error_;
  bool started_ = false;
};

}  // namespace pushpull::transport
