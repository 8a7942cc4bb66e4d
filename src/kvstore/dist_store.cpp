// SPDX-License-Identifier: Apache-2.0
// The DistStore's life and its requests: construction, sending a request to
// the current primary, replies, failures and fail-over placements. The data
// path (init, push, pull, pushpull) is in dist_store_data.cpp, the control
// operations in dist_store_control.cpp.
#include "kvstore/dist_store.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/flight_recorder.h"
#include "base/metrics.h"
#include "base/timeline.h"
#include "kvstore/validate.h"
#include "ps/protocol.h"
#include "pushpull/log.h"

namespace pushpull {

namespace {
// Whether `conn` is the connection to server `server`.
bool from_server(const cluster::Node& node, transport::ConnId conn, int server) {
  try {
    return node.conn(Role::kServer, server) == conn;
  } catch (...) {
    return false;  // that server is gone: its request fails through on_failure
  }
}
}  // namespace

DistStore::DistStore(std::string type, const Options& options)
    : KVStore(options.kvstore.wait_timeout),
      type_(std::move(type)),
      sync_(type_.find("async") == std::string::npos),
      bigarray_bound_(options.kvstore.bigarray_bound),
      chunk_bytes_(options.kvstore.chunk_bytes) {
  if (options.cluster.role != Role::kWorker)
    throw InvalidArgument(fmt::format("a '{}' store is made by a worker; this process's role is {}",
                                      type_, role_name(options.cluster.role)));
  if (options.cluster.num_servers < 1)
    throw InvalidArgument(fmt::format(
        "'{}' needs at least one server (DMLC_NUM_SERVER is {}); launch with -s S >= 1, or use "
        "dist_sync_allreduce for a job without servers",
        type_, options.cluster.num_servers));
  node_ = std::make_unique<cluster::Node>(options);
  node_->set_handler(ps::msg::kFirst, ps::msg::kLast,
                     [this](transport::Message&& m) { on_message(std::move(m)); });
  node_->on_peer_failure([this](const Status& s) { on_failure(s); });
  replicas_ = node_->ps_replicas();
  node_->on_placement([this](const cluster::Placement& p) { on_placement(p); });
  try {
    node_->start();
    one_host_ = node_->address_book().one_host;
    server_weights_ = ps::server_weights(options.kvstore.ps_server_weights, node_->address_book());
    if (!server_weights_.empty() && rank() == 0)
      PP_INFO(
          "{}: big values shared among the servers by weights {:.3f} (docs/ps.md, \"Mixed "
          "placement\")",
          type_, fmt::join(server_weights_, ","));
    node_->set_server_link_scale(ps::link_scales(server_weights_));
    if (const int incarnation = node_->incarnation(); incarnation > 0) {
      // A replacement: the servers may still answer requests of the old
      // process to this rank; ids it never used cannot match them.
      next_request_ = (static_cast<uint64_t>(incarnation) << 40) + 1;
      rejoining_ = true;
      {
        std::lock_guard lock(mu_);
        pass_due_ = sync_;
      }
      PP_WARN(
          "{} worker {} restarted (replacement {}): rejoining the running job; init adopts "
          "the servers' values",
          type_, rank(), incarnation);
      return;
    }
    Status mode;
    if (rank() == 0) {
      try {
        // With backup workers (docs/ps.md) this worker's setting is the job's.
        const KVStoreOptions& k = node_->options().kvstore;
        command_all(
            static_cast<uint64_t>(ps::Command::kSetMode),
            {ps::encode_mode({sync_, sync_ ? k.ps_backup_workers : 0, k.ps_backup_max_late})});
      } catch (...) {
        mode = Status::from_current_exception();
      }
    }
    workers_barrier();
    mode.raise();
  } catch (...) {
    // No destructor runs for a constructor that throws, and the members the
    // handlers use go before node_: stop every handler and callback first.
    node_->stop_delivery();
    throw;
  }
  PP_DEBUG("{} worker {} of {} ready ({} servers)", type_, rank(), num_workers(),
           node_->num_servers());
}

DistStore::~DistStore() {
  try {
    wait_all();
    node_->shutdown();
  } catch (const std::exception& e) {
    PP_WARN("{} store closing after an error: {}", type_, e.what());
  }
  node_.reset();  // stops the I/O thread before the members it calls into go
}

void DistStore::check_failure() const {
  std::lock_guard lock(mu_);
  failure_.raise();
}

DistStore::KeyInfo& DistStore::info(const char* op, const Key& key) const {
  auto it = keys_.find(key);
  if (it == keys_.end()) kv::throw_not_initialised(op, key);
  return *it->second;
}

std::vector<ps::Slice> DistStore::chunks_of(const Key& key) const {
  std::lock_guard lock(mu_);
  return info("chunks_of", key).slices;
}

std::vector<DistStore::KeyInfo*> DistStore::infos(const char* op, const std::vector<Key>& keys,
                                                  size_t lists) const {
  std::lock_guard lock(mu_);
  failure_.raise();
  kv::check_key_kinds(op, keys, int_keys_);
  kv::check_counts(op, keys.size(), lists);
  std::vector<KeyInfo*> out;
  for (const Key& k : keys)
    out.push_back(&info(op, k));
  return out;
}

// ---- requests and replies -------------------------------------------------

int DistStore::primary_of(int home) const {
  if (replicas_ == 0) return home;
  int p = cluster::replica_chain(home, node_->num_servers(), replicas_, placement_.dead,
                                 placement_.late)
              .primary;
  return p < 0 ? home : p;  // none left: the scheduler fails the job
}

void DistStore::request(int home, transport::Header h, const void* data, size_t n,
                        std::shared_ptr<void> keep_alive, const std::shared_ptr<Completion>& done,
                        int priority, OnData on_data, bool command) {
  uint64_t rid = next_request_++;
  requests_sent_.fetch_add(1, std::memory_order_relaxed);
  auto resend = [this, home, h, data, n, keep_alive, done, priority, on_data, command] {
    request(home, h, data, n, keep_alive, done, priority, on_data, command);
  };
  h.request_id = rid;
  PP_METRIC_ADD(kPsRequests, 1), PP_METRIC_ADD(kPsBytes, n);  // metrics hook
  PP_TIMELINE_ASYNC_BEGIN(timeline::process_node(), h.type == ps::msg::kPush ? "PUSH" : "REQUEST",
                          rid, static_cast<int64_t>(h.key),
                          static_cast<int64_t>(n));  // timeline hook
  int server;
  {
    std::lock_guard lock(mu_);
    if (!failure_.is_ok()) return done->finish(failure_);
    if (command && static_cast<size_t>(home) < placement_.dead.size() &&
        placement_.dead[static_cast<size_t>(home)])
      return done->finish(Status::ok());  // failed over: nothing of it is left to command
    server = command ? home : primary_of(home);
    h.flags |= ps::epoch_flags(placement_.epoch);
    pending_[rid] = std::make_unique<Pending>(
        Pending{done, server, std::nullopt, std::move(on_data), command, std::move(resend),
                flight_record(h.type == ps::msg::kPush ? "push" : "request", h.key, n)});
  }
  node_->send(
      Role::kServer, server, h, data, n,
      [this, rid, keep_alive](const Status& s) {
        if (!s.is_ok()) finish(rid, s);
      },
      priority);
}

uint64_t DistStore::flight_record(std::string_view kind, uint64_t key, size_t bytes) {
  char name[32];
  const auto end = fmt::format_to_n(name, sizeof name, "key {}", key).out;
  return flight::record(kind, std::string_view(name, static_cast<size_t>(end - name)),
                        static_cast<int64_t>(bytes), flight::State::kStarted);
}

void DistStore::finish(uint64_t rid, const Status& s) {
  if (!s.is_ok()) PP_METRIC_ADD(kPsRequestFailures, 1);  // metrics hook
  PP_TIMELINE_ASYNC_END(timeline::process_node(), rid);  // timeline hook
  std::unique_ptr<Pending> p;
  {
    std::lock_guard lock(mu_);
    if (!s.is_ok() && failure_.is_ok() &&
        (s.code() == ErrorCode::kIoError || s.code() == ErrorCode::kPeerFailure)) {
      // A connection broke. The cluster layer decides which node died (after
      // a short grace period, so the verdict names the real culprit) and then
      // fails every pending request through on_failure with a PeerFailure
      // naming it; until then this request stays pending.
      return;
    }
    auto it = pending_.find(rid);
    if (it == pending_.end()) return;
    p = std::move(it->second);
    pending_.erase(it);
    if (pending_.empty()) idle_cv_.notify_all();
  }
  flight::update(p->flight, s.is_ok() ? flight::State::kDone : flight::State::kFailed);
  p->done->finish(s);
}

void DistStore::on_message(transport::Message&& m) {
  const transport::Header& h = m.header;
  if (h.type != ps::msg::kReply && h.type != ps::msg::kError) {
    PP_WARN("worker ignores parameter-server message type {}", h.type);
    return;
  }
  std::unique_ptr<Pending> p;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(h.request_id);
    if (it == pending_.end()) return;  // already failed (e.g. the job failed)
    // Only the server the request went to may answer it (by connection: the
    // header's sender field is the peer's own claim).
    if (!from_server(*node_, m.conn, it->second->server)) {
      PP_WARN("worker ignores a reply to request {} from a connection other than server {}'s",
              h.request_id, it->second->server);
      return;
    }
    p = std::move(it->second);
    pending_.erase(it);
    if (pending_.empty()) idle_cv_.notify_all();
  }
  Status status;
  if (h.type == ps::msg::kError) {
    if (p->posted) cancel_posted(p->server, *p->posted);  // never throws (I/O thread)
    std::string text(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
    auto code = h.flags > 0 && h.flags <= static_cast<uint32_t>(ErrorCode::kInternal)
                    ? static_cast<ErrorCode>(h.flags)
                    : ErrorCode::kInternal;
    status = Status(code, fmt::format("server {}: {}", p->server, text));
  } else if (p->on_data) {
    try {
      p->on_data(m.payload.data(), m.payload.size());
    } catch (...) {
      status = Status::from_current_exception();
    }
  }
  flight::update(p->flight, status.is_ok() ? flight::State::kDone : flight::State::kFailed);
  p->done->finish(status);
}

void DistStore::on_failure(const Status& s) {
  std::unordered_map<uint64_t, std::unique_ptr<Pending>> failed;
  {
    std::lock_guard lock(mu_);
    if (failure_.is_ok()) failure_ = s;
    failed.swap(pending_);
    idle_cv_.notify_all();
  }
  for (auto& [rid, p] : failed) {
    flight::update(p->flight, flight::State::kFailed);
    p->done->finish(s);
  }
  flight::dump(fmt::format("failure: {}", s.message()));
}

void DistStore::on_placement(const cluster::Placement& p) {
  std::vector<std::pair<uint64_t, std::unique_ptr<Pending>>> moved;
  std::string failed;
  {
    std::lock_guard lock(mu_);
    if (p.epoch <= placement_.epoch) return;
    // The servers this placement newly marks dead: named in the log line.
    for (size_t s = 0; s < p.dead.size(); ++s)
      if (p.dead[s] && (s >= placement_.dead.size() || !placement_.dead[s]))
        failed += fmt::format("{}{}", failed.empty() ? "" : ", ", s);
    placement_ = p;
    for (auto it = pending_.begin(); it != pending_.end();) {
      size_t s = static_cast<size_t>(it->second->server);
      if (s < p.dead.size() && p.dead[s]) {
        moved.emplace_back(it->first, std::move(it->second));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // In request order, so each key's pushes and pulls keep their order.
  std::sort(moved.begin(), moved.end(), [](auto& a, auto& b) { return a.first < b.first; });
  if (node_->rank() < 0) {
    // A restarted worker learns the placement before its rank: no fail-over of its own.
    PP_INFO("worker joining at placement epoch {} (servers {} failed over)", p.epoch,
            failed.empty() ? "none" : failed);
    return;
  }
  if (failed.empty() && moved.empty()) {
    PP_INFO("worker {}: placement epoch {}: a restarted server rejoined as a backup", rank(),
            p.epoch);
    return;
  }
  PP_METRIC_ADD(kPsFailovers, 1);  // metrics hook
  PP_WARN(
      "worker {}: fail-over: server {} failed; placement epoch {}: its key ranges moved to "
      "their backups; re-sending {} requests to the new primaries",
      rank(), failed.empty() ? "?" : failed, p.epoch, moved.size());
  for (auto& [rid, pending] : moved) {
    PP_TIMELINE_ASYNC_END(timeline::process_node(), rid);  // timeline hook
    if (pending->command)
      pending->done->finish(Status::ok());  // that server is gone with its state
    else
      pending->resend();
  }
}

void DistStore::wait_all() {
  std::unique_lock lock(mu_);
  if (!idle_cv_.wait_for(lock, wait_timeout(), [&] { return pending_.empty(); })) {
    const std::string what =
        fmt::format("wait_all: {} requests to the servers still unanswered after {} ms",
                    pending_.size(), wait_timeout().count());
    lock.unlock();
    flight::dump("timeout: " + what);
    throw Timeout(what);
  }
  failure_.raise();
}

void DistStore::barrier() {
  check_failure();
  // dist_async: workers push at their own pace, so there is no position to
  // meet at; a restarted worker skips barriers until its first push (the
  // others passed them long ago) and then joins the one they are in.
  if (!sync_ && rejoining_) return;
  workers_barrier();
}

void DistStore::workers_barrier() {
  // dist_sync: the scheduler matches a replacement to the barrier at its
  // position (the one its predecessor missed, or none: it moves past it).
  node_->barrier(cluster::Group::kWorkers, {}, sync_ ? next_barrier_tag() : cluster::BarrierTag{});
}

cluster::BarrierTag DistStore::next_barrier_tag() {
  std::lock_guard lock(mu_);
  if (pushes_issued_ != tag_position_) {
    tag_position_ = pushes_issued_;
    tag_seq_ = 0;
  }
  return {true, tag_position_, ++tag_seq_};
}

}  // namespace pushpull
