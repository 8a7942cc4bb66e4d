// SPDX-License-Identifier: Apache-2.0
// The point-to-point interface the collective algorithms and the engine run
// on (Gloo's model: a per-rank context with asynchronous send/recv between
// ranks). Implementations: InProcessFabric (ranks as threads, memcpy; tests),
// TcpTransport (over transport::MessageTransport, plus direct streams), ShmTransport (one
// host's shared-memory rings) and ShmDataTransport (shared memory between a
// host's ranks, TCP to the others), and SubgroupTransport (a view of a
// subset of ranks, hierarchical_view.h).
//
// Semantics an implementation must provide:
// - post_send(peer, tag, data, bytes, done): sends the caller's bytes; the
//   caller keeps them alive and unchanged until `done` runs (zero-copy: a TCP
//   implementation writev()s straight from them).
// - post_recv(peer, tag, dst, bytes, done): the next message from `peer` with
//   `tag` lands straight in `dst`, which must hold exactly `bytes` (a size
//   mismatch completes with a ProtocolError). Messages with the same (peer,
//   tag) match in posting order; different tags never match each other.
// - `done` runs exactly once, from any thread (the poster's or the
//   transport's), never while the transport holds a lock, so it may post new
//   operations. It gets an ok Status, or PeerFailure (the peer died or closed),
//   Timeout, ProtocolError, or the closing reason of this endpoint.
// - close(reason) fails every pending operation of this rank, makes its peers'
//   operations with it fail with PeerFailure, and returns only after every
//   `done` of this endpoint has run. Later posts fail at once. Idempotent.
//
// Collectives: an algorithm builds a Schedule (schedule.h) of its sends,
// receives and reductions, and run() runs it. The default runs it with
// post_send/post_recv (run_posted); a transport with a faster path of its
// own overrides run() (the TCP transport: its direct streams, driven by the
// calling thread). Algorithms never see the difference.
//
// Thread safety: every method may be called from any thread concurrently.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "pushpull/error.h"
#include "transport/schedule.h"

namespace pushpull::transport {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
using Completion = std::function<void(const Status&)>;

class HostCollectives;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                         Completion done) = 0;
  virtual void post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) = 0;
  virtual void close(const Status& reason) = 0;
  // Like close(), for a failure of this rank (`why`): a transport that can
  // first tells the peers why, so they blame this rank with the real cause.
  virtual void abort(const Status& why) { close(why); }
  // Runs this rank's part of a collective (schedule.h; see above). Throws
  // its error (PeerFailure, Timeout, ProtocolError).
  virtual void run(const Schedule& s) { run_posted(*this, s); }
  // Whether run() reaches `peer` on a path of its own rather than through
  // post_send/post_recv (a subgroup view hands its schedules to the base's
  // run() only when all its pairs are so reached, hierarchical_view.h).
  virtual bool runs_direct_to(int peer) const {
    (void)peer;
    return false;
  }
  // Collectives over memory every rank of this transport shares
  // (host_collectives.h), or nullptr. Every rank gets the same answer.
  virtual HostCollectives* host_collectives() { return nullptr; }
};

// A waitable completion: what isend/irecv return. Copyable (shared state).
class Request {
 public:
  Request();
  // The completion to hand to the transport; marks this request done.
  Completion completion() const;
  bool done() const;
  // Blocks (condition variable) until done or `deadline`. Throws the
  // operation's error, or Timeout naming `what` when the deadline passes.
  void wait(Deadline deadline, std::string_view what) const;

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
  };
  std::shared_ptr<State> state_;
};

Request isend(Transport& t, int peer, uint64_t tag, const void* data, size_t bytes);
Request irecv(Transport& t, int peer, uint64_t tag, void* dst, size_t bytes);

// Tags: bit 63 set marks engine control traffic; otherwise the high 32 bits
// are the operation id (the same on every rank, from the agreed order) and the
// low 32 bits number the messages of that operation (step, segment).
inline constexpr uint64_t kControlTagBit = uint64_t{1} << 63;
inline uint64_t op_tag(uint64_t op_id, uint32_t index) {
  return ((op_id & 0x7fffffffu) << 32) | index;
}

}  // namespace pushpull::transport
