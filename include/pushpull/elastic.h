// SPDX-License-Identifier: Apache-2.0
// Elastic collectives: Horovod's elastic state machine (hvd.elastic.run,
// State.commit / restore / sync, reset callbacks, check_host_updates) for
// jobs whose workers leave and join. docs/elastic.md has the user's side.
//
// The loop (run()): sync the state from rank 0, call the training function;
// when a collective fails (PeerFailure: a member died, or the launcher said
// one did) restore the last commit; when the host set changed
// (HostsUpdatedInterrupt, raised by commit() / check_host_updates() on every
// rank at the same commit) keep the state as is; then re-form the group
// (`reset`: a new communicator with the new members, sizes and ranks), call
// the reset callbacks, and go round again (sync first, so the members that
// just joined get rank 0's committed state). A failure while re-forming is
// handled like any other: re-form again, until the reset itself gives up
// (the launcher refused: fewer than --min-workers for --elastic-timeout),
// which ends run() with that error.
//
// Ordering guarantees (tested in tests/collective/elastic_state_test.cpp):
//   failure:        restore() -> reset() -> callbacks (registration order) -> sync() -> fn
//   hosts updated:  reset() -> callbacks -> sync() (skipped when skip_sync) -> fn
// Participants (below, e.g. a dist_sync_allreduce KVStore) follow along:
//   commit():       save() -> elastic_save() -> check_host_updates()
//   failure:        elastic_abandon() -> restore() -> elastic_restore() -> reset()
//                   -> elastic_rebind() -> callbacks -> sync() -> elastic_sync() -> fn
//   hosts updated:  elastic_abandon() -> reset() -> elastic_rebind() -> callbacks
//                   -> sync() (if not skip_sync) -> elastic_sync() -> fn
//
// Thread safety: a State is used by the training thread only;
// on_hosts_updated() may be called from any thread (it only records a stamp).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "pushpull/collective.h"
#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull::collective::elastic {

// The host set changed (workers were added or will be removed): every rank
// raises it at the same commit. skip_sync: the state is the same on every
// member already (Horovod sets it when hosts were only removed).
class HostsUpdatedInterrupt : public std::runtime_error {
 public:
  explicit HostsUpdatedInterrupt(bool skip_sync = false)
      : std::runtime_error("elastic: the set of hosts changed; re-forming the group"),
        skip_sync_(skip_sync) {}
  bool skip_sync() const { return skip_sync_; }

 private:
  bool skip_sync_;
};

// The communicator the state agrees through (the current round's).
using CommunicatorFn = std::function<Communicator&()>;

// Something outside a State that holds values bound to the group and must
// follow its re-formation (a dist_sync_allreduce KVStore: it keeps its own
// copy of every value). State::add_participant joins it; run() and commit()
// call these at the points listed at the top of this file, from the training
// thread. Collective ones (elastic_sync) run on every member in the same order.
class Participant {
 public:
  virtual ~Participant() = default;
  // Saved copy <- live values (commit()).
  virtual void elastic_save() = 0;
  // The group is about to re-form: stop using its communicator and fail
  // (abandon) every operation pending on it, so that it may be destroyed.
  virtual void elastic_abandon() = 0;
  // Live values <- saved copy (after a member's failure, once abandoned).
  virtual void elastic_restore() = 0;
  // The group re-formed: bind to the new communicator (new size and ranks).
  virtual void elastic_rebind() = 0;
  // Every member's live and saved values <- rank 0's. Collective.
  virtual void elastic_sync() = 0;
};

// Horovod's State: what a worker must carry across a re-formation.
class State {
 public:
  explicit State(CommunicatorFn comm);
  virtual ~State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Saved copy <- live values (host memory), then check_host_updates().
  void commit();
  // Live values <- saved copy (undoes everything since the last commit).
  virtual void restore() = 0;
  // Every member's live (and saved) values <- rank 0's.
  virtual void sync() = 0;
  // Saved copy <- live values; commit() without the host check.
  virtual void save() = 0;

  // Callbacks run after every re-formation, in registration order (e.g. to
  // rescale the learning rate by the new size).
  void register_reset_callbacks(std::vector<std::function<void()>> callbacks);
  // Runs the reset callbacks; called by run() after a re-formation.
  void on_reset();
  // Records that the launcher announced a host change at `stamp` (> 0;
  // thread-safe).
  void on_hosts_updated(uint64_t stamp);
  // Throws HostsUpdatedInterrupt on every rank once any rank has recorded a
  // newer host change (the ranks agree through a max-allreduce, so all raise
  // at the same commit). Collective: every rank calls it at the same point.
  void check_host_updates();
  // Adopts the newest host change any member has agreed on (a member that
  // just joined has agreed on none): called by run() after every sync, so
  // the next check_host_updates raises on every rank or on none. Collective.
  void agree_host_stamp();

  // Joins `p` to this state (not owned: it must stay alive while joined,
  // or leave with remove_participant first). Participants are called in
  // the order they joined.
  void add_participant(Participant& p);
  void remove_participant(Participant& p);

 protected:
  Communicator& comm() { return comm_(); }

 private:
  CommunicatorFn comm_;
  std::vector<std::function<void()>> reset_callbacks_;
  std::atomic<uint64_t> announced_{0};  // newest stamp recorded by on_hosts_updated
  uint64_t agreed_ = 0;                 // newest stamp every rank agreed on
  std::vector<Participant*> participants_;
  friend void run(State&, const std::function<void()>&, const std::function<void()>&, int);
};

// State of named byte blobs (a C++ program's parameters, optimizer slots,
// epoch and batch counters): each entry points at live memory the program
// owns; commit copies it aside, restore copies it back, sync broadcasts it
// from rank 0. Sizes must not change while registered.
class BufferState : public State {
 public:
  explicit BufferState(CommunicatorFn comm) : State(std::move(comm)) {}
  // Registers live memory `data` of `bytes` bytes under `name` (saved at once).
  void add(const std::string& name, void* data, size_t bytes);
  template <typename T>
  void add_value(const std::string& name, T* value) {
    add(name, value, sizeof(T));
  }
  void save() override;
  void restore() override;
  void sync() override;

 private:
  struct Entry {
    void* data;
    size_t bytes;
    std::vector<std::byte> saved;
  };
  std::map<std::string, Entry> entries_;
};

// Horovod's hvd.elastic.run: see the loop at the top of this file. `reset`
// re-forms the group (e.g. shutdown() + init() of the default session, or a
// test's in-process group); `fn` is the training function. Returns when fn
// returns; rethrows what is not a member's failure or a host change, and
// what reset throws that is not a PeerFailure (a refusal to re-form).
// max_resets bounds the re-formations (0 = no bound) so that a group that
// keeps failing ends with the last failure.
void run(State& state, const std::function<void()>& fn, const std::function<void()>& reset,
         int max_resets = 0);

// run() over the process-default session (collective::init()): re-forming
// is shutdown() + init(), which asks the launcher for the next round. The
// C++ form of Python's @pushpull.torch.elastic.run.
void run_default(State& state, const std::function<void()>& fn);

// This process's view of an elastic job (`pushpull launch --min-workers ...`
// sets PUSHPULL_ELASTIC_ADDR); all 0 / false elsewhere. Thread-safe.
bool is_elastic_worker(const Options& options = Options::from_env());
// The newest host change the launcher announced, and the one the current
// round already includes (State::check_host_updates reads the first).
uint64_t announced_hosts_stamp();
uint64_t round_hosts_stamp();
// The current round (1, 2, ...; 0 before the first).
uint64_t current_round();

// True for the errors run() treats as a member's failure (Horovod's
// HorovodInternalError): PeerFailure (a member died, was declared dead by
// the launcher, or its connection broke).
bool is_member_failure(const std::exception& e);

}  // namespace pushpull::collective::elastic
