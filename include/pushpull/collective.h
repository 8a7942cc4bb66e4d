// SPDX-License-Identifier: Apache-2.0
// Collectives among workers (Horovod's and Gloo's model): allreduce,
// broadcast, allgather, reduce-scatter, barrier and join, by name, run by a
// background engine that negotiates an order across ranks, fuses small
// tensors and never hangs.
//
// A Communicator is one rank's member of a group. It owns a background thread
// (the only thread that talks to the transport) and the transport endpoint
// it was given. There is no process-wide state: several communicators may
// live in one process (tests run whole groups as threads).
//
// Semantics:
// - Ops are named. Every rank must submit each name (ranks may submit in
//   different orders); rank 0 collects readiness and broadcasts the agreed
//   order; ops with the same (op, dtype, reduction) that are ready together
//   are fused into one buffer up to fusion_threshold_bytes. A name may be
//   reused once its previous op completed.
// - The same name with a different shape, dtype, op, reduction or root on
//   different ranks fails that op on every rank with InvalidArgument naming
//   the tensor and every rank's signature.
// - A name that some ranks submitted and others did not for
//   stall_warning_seconds is logged (and reported to on_stall) with the
//   missing ranks; after stall_shutdown_seconds (if > 0) it fails with Timeout
//   on the ranks that submitted it.
// - A dead or closed peer (or any transport failure) fails every pending and
//   later op of this communicator with PeerFailure (or Timeout) naming the
//   rank: the communicator is then unusable; create a new group.
// - join(): a rank out of data joins; until every rank has joined, the
//   others' reductions (allreduce, reduce-scatter) proceed with it
//   contributing the identity (0 for sum and average, 1 for product,
//   +max/lowest for min/max). Average divides by the number of ranks that
//   contributed, not by size(). As Horovod, an allgather or a broadcast while
//   a rank (of its set) is joined fails with InvalidArgument on every rank
//   that submitted it. join() returns once every rank has joined, with the
//   rank that joined last.
// - Average of integer dtypes truncates toward zero. 16-bit floats are reduced
//   in float32 and rounded back at each step of the algorithm.
//
// Threading contract: every method may be called from any thread. The *_async
// calls return at once; the caller keeps the input and output memory alive
// and unchanged until the handle completes. wait() blocks on a condition
// variable (never spins) until completion or a deadline. The blocking forms
// are *_async + wait. on_stall runs on the background thread: keep it short.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pushpull/array.h"
#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull::transport {
class Transport;  // src/transport/transport.h: the point-to-point interface
}  // namespace pushpull::transport

namespace pushpull::collective {

using transport::Transport;

enum class Reduction : uint8_t { kSum = 0, kAverage = 1, kMin = 2, kMax = 3, kProduct = 4 };
std::string_view reduction_name(Reduction r);  // "sum", "average", "min", "max", "product"

struct StallReport {
  std::string tensor;
  std::vector<int> missing_ranks;
  double waited_seconds = 0;
};

struct CommunicatorOptions {
  // Fusion, cycle time, algorithm thresholds, stall settings; see options.h.
  CollectiveOptions collective;
  // Deadline of each wait on a peer inside an algorithm (progress deadline).
  Millis peer_timeout{10000};
  // Default deadline of wait(handle) and of the blocking forms.
  Millis wait_timeout{600000};
  // Called on rank 0's background thread when a tensor stalls (besides the log line).
  std::function<void(const StallReport&)> on_stall;
  // Every rank's host identity, by rank (equal strings: one host), from the
  // bootstrap's address book; empty when unknown (then no hierarchical
  // allreduce). With collective.hierarchical_allreduce it picks the
  // allreduce algorithm (docs/collectives.md).
  std::vector<std::string> hosts;

  // collective from options.collective; peer_timeout = cluster.heartbeat_timeout
  // + max(3 s, heartbeat_timeout / 2): longer than the failure detector takes
  // (heartbeat_timeout), so a stopped peer is named by the detector rather
  // than reported as an algorithm making no progress.
  static CommunicatorOptions from(const Options& options);
};

namespace detail {
struct HandleState;
}

// The result of an async call. Copyable; all copies see the same operation.
class Handle {
 public:
  Handle() = default;
  bool valid() const { return state_ != nullptr; }
  const std::string& name() const;

 private:
  friend class Communicator;
  explicit Handle(std::shared_ptr<detail::HandleState> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::HandleState> state_;
};

class Communicator {
 public:
  // Starts the background thread. `transport` is this rank's endpoint; its
  // rank() and size() are this communicator's.
  Communicator(std::unique_ptr<Transport> transport, CommunicatorOptions options);
  // shutdown().
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  // From options.collective (local_rank/local_size); rank/size when unset.
  int local_rank() const;
  int local_size() const;

  // Process sets (Horovod's): the `members` argument of the ops below lists
  // the ranks taking part (any order; empty: every rank). Only they submit the
  // op; this rank must be one of them (else InvalidArgument at once). The
  // other ranks relay and contribute as a joined rank does, from their
  // background threads, without calling anything. Every member must pass the
  // same members under a name. A reduce_scatter splits among the members.
  //
  // output = reduction of every rank's input (same shape and dtype; output
  // may be input for in place). `postscale` multiplies the result
  // (Horovod's postscale_factor, on top of kAverage's 1/n), applied by the
  // algorithm on the engine's thread (the shared-memory arena: to each
  // block while it is in cache). Every member must pass the same factor
  // (negotiated like the shape; a joined rank takes it from the others).
  Handle allreduce_async(std::string name, ArrayView input, ArrayView output,
                         Reduction op = Reduction::kSum, std::vector<int> members = {},
                         double postscale = 1.0);
  Handle allreduce_async(std::string name, ArrayView inout, Reduction op = Reduction::kSum) {
    return allreduce_async(std::move(name), inout, inout, op);
  }
  void allreduce(std::string name, ArrayView input, ArrayView output,
                 Reduction op = Reduction::kSum);
  void allreduce(std::string name, ArrayView inout, Reduction op = Reduction::kSum) {
    allreduce(std::move(name), inout, inout, op);
  }
  // data on every rank becomes root's data (in place).
  Handle broadcast_async(std::string name, ArrayView data, int root, std::vector<int> members = {});
  void broadcast(std::string name, ArrayView data, int root);
  // Concatenation of every rank's input along the first dimension, in rank
  // order (first dimensions may differ; the others must match; a scalar
  // counts as one row). Result via take_output().
  Handle allgather_async(std::string name, ArrayView input, std::vector<int> members = {});
  Array allgather(std::string name, ArrayView input);
  // The reduction of every rank's input, split along the first dimension:
  // rank r gets rows [r*q + min(r, m), ...) with q = rows / size, m = rows %
  // size (the first m ranks one row more). Result via take_output().
  Handle reduce_scatter_async(std::string name, ArrayView input, Reduction op = Reduction::kSum,
                              std::vector<int> members = {});
  Array reduce_scatter(std::string name, ArrayView input, Reduction op = Reduction::kSum);
  Handle barrier_async();
  void barrier();
  Handle join_async();
  // Returns the rank that joined last (as Horovod's join).
  int join();

  // True once the operation completed (successfully or not).
  bool poll(const Handle& h) const;
  // Blocks until completion or the deadline (default wait_timeout); throws
  // the operation's error, or Timeout naming the tensor.
  void wait(const Handle& h, std::optional<Millis> timeout = std::nullopt) const;
  // wait(), then moves out the result of an allgather / reduce_scatter.
  Array take_output(const Handle& h, std::optional<Millis> timeout = std::nullopt) const;

  // OK while healthy; once a failure ended the collectives (a peer failed, a
  // stall shutdown, a malformed message), that failure.
  Status failure() const;

  // Fails pending ops with an error saying the communicator shut down, stops
  // the background thread and closes the transport (peers with pending ops
  // see PeerFailure). Idempotent; local, not collective.
  void shutdown();

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> barrier_seq_{0};
};

// ---- Bootstrap, Session and the Horovod-style free functions ----------------
//
// A Session is this process's member of the workers' group, built from the
// job's Options however the process was started (details: docs/collectives.md
// "Bootstrap"):
// - in a pushpull job with a scheduler (DMLC_ROLE=worker, servers >= 1): the
//   workers of the job, from the scheduler's address book;
// - otherwise from a rank and world size (RANK / WORLD_SIZE as torchrun and
//   `pushpull launch -s 0` set them; OMPI_COMM_WORLD_RANK / _SIZE under
//   mpirun; SLURM_PROCID / SLURM_NTASKS under srun) and a rendezvous
//   address MASTER_ADDR / MASTER_PORT (PUSHPULL_MASTER_ADDR / _PORT) where
//   rank 0 listens;
// - with none of these set: a world of one.
//
// Construction blocks until every rank joined, at most
// ClusterOptions::startup_timeout: a missing rank is a Timeout naming it, a
// rank that dies during the rendezvous a PeerFailure, inconsistent settings an
// InvalidArgument saying which variables to set. After that, a rank that dies
// fails every pending and later op of every other rank with PeerFailure
// (see Communicator).
//
// Ownership: the Session owns its Communicator, sockets and threads (and, in
// a job with a scheduler, its cluster node). One Session per process and job:
// a second one would register a second worker with the scheduler or bind
// MASTER_PORT twice. Thread safety: as Communicator.
class Store;  // src/collective/store.h

class Session {
 public:
  explicit Session(const Options& options = Options::from_env());
  // The ranks meet through `store` (torch's c10d store, wrapped) instead of
  // MASTER_ADDR: options.collective's rank and size (> 1) are the group's.
  // `store` is only used during construction.
  Session(const Options& options, Store& store);
  // shutdown().
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Communicator& communicator();
  int rank() const;
  int size() const;
  int local_rank() const;
  int local_size() const;
  // "single", "cluster" or "rendezvous": how the group was found.
  std::string_view mode() const;
  // Shuts the communicator down (local, not collective; peers with pending
  // ops see PeerFailure) and, in a job with a scheduler, leaves the job in
  // order (waits, up to barrier_timeout, for the other nodes to leave).
  // Idempotent; errors while leaving are logged, not thrown.
  void shutdown();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Horovod's module-level API (hvd.init(), hvd.rank(), hvd.allreduce(...)).
//
// Why a global here: DESIGN.md forbids process-wide singletons so that
// several groups can live in one process; Horovod users expect free
// functions. Both hold: the primary API is the Session object above (owned by
// the caller, any number of them), and these functions are a convenience
// over ONE process-default Session, the only collective global. It exists
// only between init() and shutdown(): nothing is created before the user
// calls init(), and shutdown() destroys it. Every function other than init()
// and is_initialized() throws InvalidArgument ("call
// pushpull::collective::init() first") when there is no default session.
//
// init() with a default session already there does nothing (as hvd.init()).
// Thread safety: every function may be called from any thread; a shutdown()
// concurrent with an op lets the op finish (or fail) before the session goes.
void init(const Options& options = Options::from_env());
bool is_initialized();
// The default session (for what the free functions do not cover).
Session& default_session();
int size();
int rank();
int local_rank();
int local_size();
// This process's place in the default session as environment variables
// (name, value): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, their
// PUSHPULL_ twins, HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK,
// _CROSS_SIZE: what `pushpull launch` and an elastic round set (Python copies
// them into os.environ after a re-formation).
std::vector<std::pair<std::string, std::string>> rank_environment();

Handle allreduce_async(std::string name, ArrayView input, ArrayView output,
                       Reduction op = Reduction::kSum);
Handle allreduce_async(std::string name, ArrayView inout, Reduction op = Reduction::kSum);
void allreduce(std::string name, ArrayView input, ArrayView output, Reduction op = Reduction::kSum);
void allreduce(std::string name, ArrayView inout, Reduction op = Reduction::kSum);
Handle broadcast_async(std::string name, ArrayView data, int root);
void broadcast(std::string name, ArrayView data, int root);
Handle allgather_async(std::string name, ArrayView input);
Array allgather(std::string name, ArrayView input);
Handle reduce_scatter_async(std::string name, ArrayView input, Reduction op = Reduction::kSum);
Array reduce_scatter(std::string name, ArrayView input, Reduction op = Reduction::kSum);
void barrier();
// The rank that joined last.
int join();
bool poll(const Handle& h);
void wait(const Handle& h, std::optional<Millis> timeout = std::nullopt);
Array take_output(const Handle& h, std::optional<Millis> timeout = std::nullopt);
// Destroys the default session (Session::shutdown); nothing when there is none.
void shutdown();

}  // namespace pushpull::collective
