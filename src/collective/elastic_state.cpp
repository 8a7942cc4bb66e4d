// SPDX-License-Identifier: Apache-2.0
// The elastic state machine (include/pushpull/elastic.h).
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "base/metrics.h"
#include "pushpull/elastic.h"
#include "pushpull/log.h"

namespace pushpull::collective::elastic {

State::State(CommunicatorFn comm) : comm_(std::move(comm)) {}

void State::commit() {
  save();
  for (Participant* p : participants_)
    p->elastic_save();
  check_host_updates();
}

void State::add_participant(Participant& p) {
  if (std::find(participants_.begin(), participants_.end(), &p) == participants_.end())
    participants_.push_back(&p);
}

void State::remove_participant(Participant& p) {
  std::erase(participants_, &p);
}

void State::register_reset_callbacks(std::vector<std::function<void()>> callbacks) {
  for (auto& c : callbacks)
    reset_callbacks_.push_back(std::move(c));
}

void State::on_reset() {
  for (auto& c : reset_callbacks_)
    c();
}

void State::on_hosts_updated(uint64_t stamp) {
  uint64_t cur = announced_.load();
  while (stamp > cur && !announced_.compare_exchange_weak(cur, stamp)) {
  }
}

void State::check_host_updates() {
  // Every rank must raise at the same commit, but the launcher's notice
  // reaches the ranks at different times: agree on the newest stamp any rank
  // has seen (a max-allreduce, where Horovod broadcasts rank 0's).
  int64_t stamp = static_cast<int64_t>(std::max(announced_.load(), announced_hosts_stamp()));
  ArrayView v(&stamp, DType::kInt64, Shape{1});
  // One fixed name: a member that just joined counts from zero.
  comm().allreduce("elastic.hosts", v, Reduction::kMax);
  const uint64_t agreed = static_cast<uint64_t>(stamp);
  if (agreed > agreed_) {
    agreed_ = agreed;
    on_hosts_updated(agreed);
    throw HostsUpdatedInterrupt(false);
  }
}

void State::agree_host_stamp() {
  int64_t stamp = static_cast<int64_t>(std::max(agreed_, round_hosts_stamp()));
  ArrayView v(&stamp, DType::kInt64, Shape{1});
  comm().allreduce("elastic.hosts", v, Reduction::kMax);
  agreed_ = static_cast<uint64_t>(stamp);
  on_hosts_updated(agreed_);
}

void BufferState::add(const std::string& name, void* data, size_t bytes) {
  Entry e{data, bytes, std::vector<std::byte>(bytes)};
  if (bytes) std::memcpy(e.saved.data(), data, bytes);
  entries_[name] = std::move(e);
}

void BufferState::save() {
  for (auto& [name, e] : entries_)
    if (e.bytes) std::memcpy(e.saved.data(), e.data, e.bytes);
}

void BufferState::restore() {
  for (auto& [name, e] : entries_)
    if (e.bytes) std::memcpy(e.data, e.saved.data(), e.bytes);
}

void BufferState::sync() {
  // Names are the same on every rank (std::map: the same order too), also
  // on a member that just joined; a failed round's ops died with its
  // communicator, so reusing the names is safe.
  for (auto& [name, e] : entries_) {
    if (!e.bytes) continue;
    ArrayView v(e.data, DType::kUInt8, Shape{static_cast<int64_t>(e.bytes)});
    comm().broadcast("elastic.sync." + name, v, 0);
    std::memcpy(e.saved.data(), e.data, e.bytes);
  }
}

bool is_member_failure(const std::exception& e) {
  const auto* err = dynamic_cast<const Error*>(&e);
  return err != nullptr && err->code() == ErrorCode::kPeerFailure;
}

void run(State& state, const std::function<void()>& fn, const std::function<void()>& reset,
         int max_resets) {
  bool skip_sync = false;
  for (int resets = 0;; ++resets) {
    try {
      if (!skip_sync) state.sync();
      // Always: a participant's operations abandoned mid-flight may have
      // been applied on some members and not on others.
      for (Participant* p : state.participants_)
        p->elastic_sync();
      state.agree_host_stamp();
      fn();
      return;
    } catch (const HostsUpdatedInterrupt& e) {
      PP_INFO("elastic: {}", e.what());
      skip_sync = e.skip_sync();
      for (Participant* p : state.participants_)
        p->elastic_abandon();
    } catch (const std::exception& e) {
      if (!is_member_failure(e)) throw;
      PP_WARN("elastic: a member failed ({}); restoring the last commit and re-forming", e.what());
      for (Participant* p : state.participants_)
        p->elastic_abandon();
      state.restore();
      for (Participant* p : state.participants_)
        p->elastic_restore();
      skip_sync = false;
    }
    if (max_resets > 0 && resets + 1 > max_resets)
      throw PeerFailure(fmt::format(
          "elastic: the group was re-formed {} times (the limit); giving up", max_resets));
    // A member failing while the group re-forms is one more failure: re-form
    // again (reset throws what ends the job: a refusal of the launcher).
    for (;;) {
      try {
        reset();
        break;
      } catch (const std::exception& e) {
        if (!is_member_failure(e)) throw;
        PP_WARN("elastic: re-forming failed ({}); trying again", e.what());
        if (max_resets > 0 && ++resets + 1 > max_resets) throw;
      }
    }
    PP_METRIC_ADD(kElasticReformations, 1);  // metrics hook
    for (Participant* p : state.participants_)
      p->elastic_rebind();
    state.on_reset();
  }
}

void run_default(State& state, const std::function<void()>& fn) {
  run(state, fn, [] {
    collective::shutdown();
    collective::init();
  });
}

}  // namespace pushpull::collective::elastic
