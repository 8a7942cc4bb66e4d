// SPDX-License-Identifier: Apache-2.0
// The parameter server's store: the state machine behind MXNet's dist_sync and
// dist_async semantics, independent of the network (the networked server in
// server.h feeds it requests and sends what it answers; tests drive it
// directly).
//
// Per part (one chunk of one key's slice on this server, named by the key id
// and the chunk's first element):
//  - init stores the first value; a second init is AlreadyExists.
//  - sync mode: a push from worker w is summed into the round's merge buffer
//    (float32 for 16-bit types). When all N workers have pushed, the round is
//    applied: the optimizer runs on (stored, sum), or without one the sum
//    replaces the stored value. Pushes are acknowledged when their round is
//    applied. A worker pushing again before its round is applied has that
//    push held for the next round. A pull from w is answered once every push
//    w made before the pull has been applied ("a pull after a push sees that
//    round").
//  - async mode: every push is applied at once; an optimizer is required.
//  - pulls may ask for element ranges only (row_sparse_pull).
//  - pushes may be compressed (compress/compressor.h wire form: 2bit, 1bit,
//    fp16): decoded into the round's float32 sum. Without an optimizer, a
//    float32 part whose round was pushed compressed is answered compressed
//    too (docs/kvstore.md "Compressed pulls"): the new value (the sum) is
//    encoded once, with the server's own residual per part (error feedback),
//    the stored value becomes what that decodes to, and every pull of the
//    whole part gets the same encoded bytes. With an optimizer pulls answer
//    the value itself.
//  - bounded: ServerStoreConfig::max_queued_per_worker held pushes and
//    waiting pulls per worker and part; ranges are checked without overflow.
//  - replication (ServerStoreConfig::replicate, docs/ps.md "Fault
//    tolerance"): after an init or a round, the part's state (value,
//    optimizer state, per-worker applied sequence numbers) goes to the
//    responder's replicate(); until every live backup has it, the round's
//    pushes are not acknowledged, no pull is answered and later pushes are
//    held, so nothing a worker saw can be lost with this server. A backup
//    installs such a state with install_replica() and is then, for that part,
//    a primary in waiting: promotion needs no step of its own.
//  - backup workers (ServerStoreConfig::backup_workers = b > 0, sync mode;
//    docs/ps.md "Backup workers"): a round closes once N - b workers pushed
//    (more if more had already arrived); its sum is scaled by N / (N - b). A
//    worker missing from a closed round has that round's sequence number
//    marked applied at once (so replicas and a promoted backup know it), and
//    its push for it, when it comes, is acknowledged, dropped and counted
//    (late_pushes_dropped()); until then and right after, its pulls get the
//    value of its own round (the store keeps up to backup_max_late earlier
//    values). A round never closes if that would put a worker more than
//    backup_max_late rounds behind: it waits for that worker's push.
//  - duplicates: a push carrying a sequence number that was already applied
//    (a worker re-sending the unfinished round to a promoted backup) is
//    acknowledged without being counted again.
//  - worker restart (docs/ps.md "Worker restart"): rejoin() from a worker's
//    replacement detaches the old process's pending requests of that part
//    (answers to them are not sent: request id 0), answers with the rank's
//    applied and accepted sequence numbers and the current value, and lets
//    the replacement's push of a sequence number the old process already
//    sent (accepted, not applied) take that push's place (adopted: counted
//    once, acknowledged to the replacement). A sync round missing the dead
//    worker's push simply stays open until the replacement pushes.
//
// Copies: the first push of a round is adopted as the round's sum (no copy)
// when its dtype is the sum's; without an optimizer the sum then becomes the
// stored value (no copy). A pull answers with the stored value itself plus a
// reference that keeps it alive while it is being sent; a later update of a
// value still referenced that way works on a fresh copy (copy on write).
//
// Threading: requests for one part run in arrival order on that part's thread
// of a ShardedExecutor (ServerStoreConfig::threads); different parts run in
// parallel. Every public method only queues work and returns. The responder
// is called from those threads. Ownership: payloads are kept alive by their
// `owner` until the task that reads them has run (or longer, when adopted).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/executor.h"
#include "base/file_auth.h"
#include "compress/settings.h"
#include "pushpull/array.h"
#include "pushpull/error.h"
#include "pushpull/optimizer.h"
#include "transport/buffer_pool.h"

namespace pushpull::ps {

// Who asked, so the answer can find its way back.
struct RequestMeta {
  int worker = 0;
  uint64_t request_id = 0;
  uint64_t key = 0;  // echoed in the answer (the worker matches on it)
  // A push answered with the part's value once applied, as a pull sent right
  // behind it would be, instead of an empty acknowledgement (kFlagPullBack).
  bool pull_back = false;
};

// One part of a key held by this server.
struct PartId {
  uint64_t key = 0;
  int64_t begin = 0;  // first element of the part within the whole value
  bool operator==(const PartId&) const = default;
};
struct PartIdHash {
  size_t operator()(const PartId& p) const {
    return std::hash<uint64_t>()(p.key * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(p.begin));
  }
};

// A view of received bytes plus whatever keeps them alive.
struct Payload {
  ArrayView view;
  std::shared_ptr<void> owner;
  // Never written in place, even with no other reference: another process's
  // memory, mapped read-only (a pinned replica, transport/shm/lend.h).
  bool read_only = false;
};

// An element range of a key's slice (row_sparse_pull asks for rows).
struct Range {
  int64_t begin = 0;
  int64_t count = 0;
};

// One part's state as a primary sends it to its backups.
struct ReplicaState {
  std::string name;
  int home = -1;                      // the part's server in the fault-free placement
  Payload value;                      // shared with the store: not written while referenced
  std::vector<uint64_t> applied_seq;  // per worker: last applied push sequence number
  std::string optimizer_states;       // Optimizer::save_key_states; "" without optimizer
  // Backup workers: per worker, the closed rounds it has not pushed yet
  // (empty: nobody is behind). A promoted backup answers their pulls with
  // the values of their rounds, which it kept from earlier replicas.
  std::vector<uint64_t> behind;
  // Where `value` lies when the store allocated it in lendable memory
  // (ServerStoreConfig::lendable_values), for lending it to a same-host
  // backup; nullopt otherwise (transport::BufferPool::find_lent).
  std::optional<transport::LendRef> lent;
};

class ServerResponder {
 public:
  virtual ~ServerResponder() = default;
  // Answers a request. `data` (may be empty) stays valid and unchanged while
  // `owner` is held; with a null owner only during the call.
  virtual void reply(const RequestMeta& to, const Status& status, DType dtype,
                     std::span<const std::byte> data, std::shared_ptr<void> owner = nullptr) = 0;
  // Sends `state` of `part` to its live backups. Returns false when there
  // are none (`done` is then not called); else `done` runs once, on any
  // thread, when every live backup has installed it (or died). Must not
  // call back into the store synchronously.
  virtual bool replicate(const PartId& part, std::shared_ptr<const ReplicaState> state,
                         std::function<void()> done) {
    (void)part, (void)state, (void)done;
    return false;
  }
};

struct ServerStoreConfig {
  int num_workers = 1;
  bool sync = true;
  int threads = 1;      // 0: no thread; the owner calls run_queued() (tests/sim/)
  int server_rank = 0;  // for messages
  // Memory bound: per worker and part, at most this many pushes held for a
  // later round (sync mode) and as many pulls waiting for its pushes; one
  // more is refused with ProtocolError (a worker cannot be that far ahead
  // unless it ignores its acknowledgements).
  int max_queued_per_worker = 64;
  // Whether inits and rounds are replicated (ServerResponder::replicate).
  bool replicate = false;
  // Checkpoints (docs/ps.md "Checkpoints", ps/checkpoint.h): every this many
  // sync rounds (0: never) the parts this server is home for are written to
  // checkpoint_dir once all of them completed the round (the file is written
  // on the thread of the part completing it last).
  int64_t checkpoint_every = 0;
  std::string checkpoint_dir = {};
  int num_servers = 1;  // for the checkpoint's header
  // Authenticates the files (base::checkpoint_key); required with
  // checkpoint_every > 0 (without it, no file is written: an error is logged).
  base::FileKey checkpoint_key = {};
  // Values of 256 KiB and more the store allocates live in lendable memory
  // (transport/shm/lend.h), so the responder can lend them to same-host backups.
  bool lendable_values = false;
  // Backup workers (sync only): a round closes after num_workers -
  // backup_workers pushes; 0 = every worker's push (must be < num_workers).
  int backup_workers = 0;
  // With backup workers: how many rounds a worker may be behind (>= 1).
  int backup_max_late = 8;
};

struct Checkpoint;

class ServerStore {
 public:
  ServerStore(ServerStoreConfig config, ServerResponder& responder);
  ~ServerStore();  // runs queued work, then stops the threads
  ServerStore(const ServerStore&) = delete;
  ServerStore& operator=(const ServerStore&) = delete;

  // `name` is the key as the user wrote it (for messages and to detect
  // string-key id collisions).
  // `home`: the part's server in the fault-free placement (-1: this one).
  void init(const RequestMeta& m, PartId part, std::string name, Payload value, int home = -1);
  // `seq`: the push's sequence number mod 2^24 (protocol.h), 0 = none.
  void push(const RequestMeta& m, PartId part, Payload grad, bool compressed, uint32_t seq = 0);
  // Empty `ranges`: the whole part; else element ranges relative to the part.
  void pull(const RequestMeta& m, PartId part, std::vector<Range> ranges);
  // A restarted worker m.worker asks for the part (see above). The answer's
  // data: ps::encode_rejoin(applied, accepted sequence numbers of that rank),
  // then the value's bytes; given once the part is not being replicated.
  void rejoin(const RequestMeta& m, PartId part);
  // Installs the optimizer for every later round (state of an earlier
  // optimizer is dropped). Answers once installed.
  void set_optimizer(const RequestMeta& m, const OptimizerSpec& spec);
  // Answers with the optimizer's serialised states (after earlier updates).
  void save_states(const RequestMeta& m);
  void load_states(const RequestMeta& m, std::string bytes);
  // A backup: replaces the part's state with the primary's (creating the
  // part when new); `done` runs on the store's thread once installed, with
  // an error when the state does not fit (e.g. another dtype). `fill`, when
  // given, runs first on that thread and sets state.value (a lent value,
  // transport/shm/lend.h); its error goes to `done` instead.
  void install_replica(PartId part, ReplicaState state, std::function<void(const Status&)> done,
                       std::function<Status(ReplicaState&)> fill = {});

  // Installs a checkpoint's parts (before any request: the caller makes sure
  // nothing runs). A restored part answers the first init for it without
  // changing it, if the init's name, dtype and shape match (else an error
  // naming the checkpoint); its optimizer states join the optimizer installed
  // later, before its first update; its round count continues from the
  // checkpoint's round. Push sequence numbers start afresh (new workers).
  void restore(const Checkpoint& c, const std::string& source);

  // Server rejoin (docs/ps.md "Server rejoin"): on each part's thread, for
  // every part `wanted(part, home)` accepts, builds its current state and
  // calls `send(part, state, done)` (done once delivered); `all_done` runs
  // once every selected part's done ran.
  void transfer(
      std::function<bool(const PartId&, int home)> wanted,
      std::function<void(const PartId&, std::shared_ptr<const ReplicaState>, std::function<void()>)>
          send,
      std::function<void()> all_done);

  // Blocks until everything queued so far has run.
  void wait_idle(Millis timeout) { executor_.wait_idle(timeout); }
  // threads = 0: runs what is queued (and what that queues); how many ran.
  size_t run_queued() { return executor_.run_queued(); }
  bool sync() const { return config_.sync; }
  // Whether any key was initialised (queued inits that have not run yet do
  // not count).
  bool has_keys() const;
  // Pushes dropped because their round had closed without them (backup
  // workers); any thread.
  int64_t late_pushes_dropped() const { return late_dropped_.load(); }

 private:
  struct Entry;
  Entry* find(const PartId& part);
  void apply_round(const PartId& part, Entry& e);
  std::shared_ptr<ReplicaState> state_of(const PartId& part, Entry& e);
  // After an update: replicates, then finish_round (at once without backups).
  void publish(const PartId& part, Entry& e);
  // Acknowledges the round, answers pulls, opens the next round.
  void finish_round(const PartId& part, Entry& e);
  void apply_push(Entry& e, const Payload& grad, bool compressed);
  // Compressed pulls (server_store_pull.cpp): records the codec of a push
  // (nullopt: uncompressed) of the open round; after a round without an
  // optimizer, encodes the new value once with the part's residual and
  // makes the value what that encoding decodes to.
  static void note_round_codec(Entry& e, bool first, std::optional<compress::Settings> codec);
  void compress_for_pulls(Entry& e);
  void answer_ready_pulls(Entry& e);
  void answer_pull(Entry& e, const RequestMeta& m, const std::vector<Range>& ranges);
  // A pull (or a push's pull-back) of `m.worker`: answered now when every
  // push received from that worker is applied, else queued until it is.
  void pull_when_applied(Entry& e, const RequestMeta& m, std::vector<Range> ranges);
  // A re-sent push or init this server applied already: `answer` runs (on
  // the part's thread) once this server's backups hold its state of the part.
  void acknowledge_after_republish(const PartId& part, Entry& e,
                                   std::function<void(Entry&)> answer);
  // A push of the closing round is done: its acknowledgement, or for a
  // pull-back (and no error) the value, in order with the waiting pulls.
  void acknowledge_push(Entry& e, const RequestMeta& m, const Status& status);
  void answer_rejoin(Entry& e, const RequestMeta& m);
  // A replacement's push of sequence number `seq` takes the place of the old
  // process's accepted push with that number; false when there is none.
  static bool adopt(Entry& e, const RequestMeta& m, uint64_t seq);
  void fail(const RequestMeta& m, const Status& s);
  // Throws InvalidArgument for backup workers outside 0 .. num_workers - 1.
  static void check_backup_config(const ServerStoreConfig& config);
  // Backup workers: pushes a sync round needs before it may close.
  int round_quorum() const;
  // Whether the open sync round may close now (enough pushes, and nobody
  // missing it would fall more than backup_max_late rounds behind).
  bool round_ready(const Entry& e) const;
  // A push of `m.worker` whose round closed without it: answered (a
  // pull-back with that round's value), dropped, counted.
  void drop_late(Entry& e, const RequestMeta& m);
  // A late push arriving: held while the part replicates (answered once its
  // backups hold the round it missed), else dropped; the open round may
  // then close (it may have waited for this worker, backup_max_late).
  void late_push(const PartId& part, Entry& e, const RequestMeta& m);
  // Around apply_round: scales the sum by N / pushes and keeps the value
  // being replaced (open_); marks the round's absent workers' sequence
  // numbers applied and trims the kept values (close_).
  void open_backup_round(Entry& e);
  void close_backup_round(Entry& e);
  // A backup installing `state` over `e` (existed: it held a value): keeps
  // the replaced value by its round, sets the sequence numbers (a worker
  // behind has received fewer than applied) and trims what is kept.
  void install_backup_state(Entry& e, const ReplicaState& state, bool existed);
  // state_of's part for backup workers: who is behind (ReplicaState::behind).
  void add_behind(const Entry& e, ReplicaState& state) const;
  // Counts a completed sync round of a part this server is home for and,
  // every checkpoint_every rounds, adds its state to that round's checkpoint.
  void count_round(const PartId& part, Entry& e);
  // The part's optimizer states (a restored part's until first merged).
  std::string optimizer_states_of(const PartId& part, Entry& e);
  std::shared_ptr<Optimizer> optimizer() const;
  // Runs on every thread of the executor (optimizer changes and state saves
  // must see every key's earlier work).
  void on_all_threads(std::function<void()> fn);

  ServerStoreConfig config_;
  ServerResponder& responder_;
  transport::BufferPool value_pool_;  // lending with config_.lendable_values
  transport::BufferPool* lending_pool() { return config_.lendable_values ? &value_pool_ : nullptr; }
  mutable std::mutex mu_;  // guards entries_' structure and optimizer_
  std::unordered_map<PartId, std::unique_ptr<Entry>, PartIdHash> entries_;
  std::shared_ptr<Optimizer> optimizer_;
  std::string restored_from_;  // the checkpoint's file, for messages
  std::mutex checkpoint_mu_;   // guards pending_checkpoints_
  struct PendingCheckpoint;
  // By round; at most kMaxPendingCheckpoints (a range that stopped being
  // pushed must not make every later round's values pile up here).
  std::map<int64_t, std::shared_ptr<PendingCheckpoint>> pending_checkpoints_;
  static constexpr size_t kMaxPendingCheckpoints = 4;
  std::atomic<int64_t> late_dropped_{0};
  ShardedExecutor executor_;  // last: destroyed first, while the rest is alive
};

}  // namespace pushpull::ps
