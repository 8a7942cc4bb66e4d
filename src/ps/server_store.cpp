// SPDX-License-Identifier: Apache-2.0
// ServerStore's init and pushes. Applying a round and publishing it to the
// backups are in server_store_round.cpp, pulls in server_store_pull.cpp, the
// control commands in server_store_control.cpp, rejoins and replicas in
// server_store_recovery.cpp.
#include "ps/server_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "ps/checkpoint.h"
#include "ps/protocol.h"
#include "ps/server_store_entry.h"
#include "pushpull/log.h"

namespace pushpull::ps {

using namespace server_store_detail;

ServerStore::ServerStore(ServerStoreConfig config, ServerResponder& responder)
    : config_(config),
      responder_(responder),
      value_pool_(8, config.lendable_values),
      executor_(std::max(0, config.threads), fmt::format("pp-server{}", config.server_rank)) {
  check_backup_config(config_);
}

ServerStore::~ServerStore() = default;

ServerStore::Entry* ServerStore::find(const PartId& part) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(part);
  return it == entries_.end() ? nullptr : it->second.get();
}

bool ServerStore::has_keys() const {
  std::lock_guard lock(mu_);
  return !entries_.empty();
}

std::shared_ptr<Optimizer> ServerStore::optimizer() const {
  std::lock_guard lock(mu_);
  return optimizer_;
}

void ServerStore::fail(const RequestMeta& m, const Status& s) {
  responder_.reply(m, s, DType::kFloat32, {});
}

void ServerStore::init(const RequestMeta& m, PartId part, std::string name, Payload value,
                       int home) {
  executor_.submit(shard_of(part), [this, m, part, name = std::move(name), value, home]() mutable {
    Entry* made = nullptr;
    Entry* resent = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = entries_.find(part);
      if (it != entries_.end() && it->second->from_replica && it->second->name == name) {
        // Worker 0 re-sent its init after a fail-over: this backup has it.
        Entry& e = *it->second;
        if (e.replicating) {
          e.init_acks.push_back(m);
          return;
        }
        resent = &e;
      }
      if (resent) {
      } else if (it != entries_.end() && it->second->restored) {
        Entry& e = *it->second;
        const ArrayView& v = e.value.view;
        if (e.name != name || v.dtype != value.view.dtype || !(v.shape == value.view.shape)) {
          responder_.reply(
              m,
              Status(
                  ErrorCode::kInvalidArgument,
                  fmt::format("init of key {} ({}) does not match checkpoint '{}', which holds "
                              "key {} ({}) under this id: resume with the same program and "
                              "layout (servers, workers, and all on one host or not: that "
                              "sets the chunks)",
                              name, value.view.describe(), restored_from_, e.name, v.describe())),
              DType::kFloat32, {});
          return;
        }
        // Resumed: the checkpoint's value stands; the backups get it now.
        e.restored = false;
        made = &e;
      } else if (it != entries_.end()) {
        std::string what = it->second->name == name
                               ? fmt::format("key {} is already initialised", name)
                               : fmt::format("keys {} and {} have the same id {}; rename one",
                                             it->second->name, name, part.key);
        responder_.reply(m, Status(ErrorCode::kAlreadyExists, what), DType::kFloat32, {});
        return;
      }
      if (!made && !resent) {
        auto e = std::make_unique<Entry>();
        e->name = name;
        // A copy, aligned for the kernels (the request's bytes follow the key's name).
        e->value = fresh(value.view.shape, value.view.dtype, lending_pool());
        if (value.view.nbytes())
          std::memcpy(e->value.view.data, value.view.data, value.view.nbytes());
        e->merged_dtype = is_half(e->value.view.dtype) ? DType::kFloat32 : e->value.view.dtype;
        e->size_for(config_.num_workers);
        e->home = home >= 0 ? home : config_.server_rank;
        made = e.get();
        entries_.emplace(part, std::move(e));
      }
    }
    if (resent)
      return acknowledge_after_republish(part, *resent, [this, m](Entry&) {
        responder_.reply(m, Status::ok(), DType::kFloat32, {});
      });
    made->init_acks.push_back(m);
    publish(part, *made);
  });
}

void ServerStore::push(const RequestMeta& m, PartId part, Payload grad, bool compressed,
                       uint32_t seq24) {
  executor_.submit(shard_of(part), [this, m, part, grad = std::move(grad), compressed, seq24] {
    Entry* e = find(part);
    if (!e)
      return fail(m, Status(ErrorCode::kNotFound,
                            fmt::format("push to key id {} that was never initialised", part.key)));
    if (m.worker < 0 || m.worker >= config_.num_workers)
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("push from unknown worker {}", m.worker)));
    const ArrayView& v = e->value.view;
    if (!compressed && (grad.view.dtype != v.dtype || grad.view.numel() != v.numel()))
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("push to key {}: got {}, the key holds {}", e->name,
                                        grad.view.describe(), v.describe())));
    if (!config_.sync && !optimizer())
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("dist_async push to key {} before set_optimizer: an "
                                        "asynchronous store needs an optimizer on the servers",
                                        e->name)));
    uint64_t seq = 0;
    const bool backup = config_.sync && config_.backup_workers > 0;
    if (seq24 != 0 || backup) {
      // With backup workers a push without a number is the worker's next one.
      seq = seq24 != 0 ? unwrap_seq(seq24, e->last_seq[m.worker] + 1) : e->last_seq[m.worker] + 1;
      if (backup && seq > e->last_seq[m.worker] && seq <= e->applied_seq[m.worker]) {
        // Its round closed without it (backup workers): dropped, answered.
        e->last_seq[m.worker] = seq;
        return late_push(part, *e, m);
      }
      if (seq <= e->applied_seq[m.worker]) {
        // Applied (and replicated) already: a worker re-sent the push of an
        // unfinished round after a fail-over. Counting it again would be wrong.
        PP_DEBUG("duplicate push {} of key {} from worker {} dropped", seq, e->name, m.worker);
        return acknowledge_after_republish(part, *e, [this, m](Entry& e) {
          if (m.pull_back) return pull_when_applied(e, m, {});
          responder_.reply(m, Status::ok(), DType::kFloat32, {});
        });
      }
      if (seq <= e->last_seq[m.worker] && e->rejoined[m.worker] && adopt(*e, m, seq)) return;
      if (seq <= e->last_seq[m.worker])
        return fail(m, Status(ErrorCode::kProtocolError,
                              fmt::format("push {} of key {} from worker {} arrived twice", seq,
                                          e->name, m.worker)));
      e->last_seq[m.worker] = seq;
    }
    // This worker is a round ahead, or the round is being replicated: hold it.
    if ((config_.sync && e->pushed[m.worker]) || e->replicating) {
      if (e->held_by[m.worker] >= config_.max_queued_per_worker)
        return fail(m, Status(ErrorCode::kProtocolError,
                              fmt::format("push to key {}: worker {} already has {} pushes held "
                                          "for later rounds",
                                          e->name, m.worker, e->held_by[m.worker])));
      e->received[m.worker]++;
      e->held_by[m.worker]++;
      e->held.push_back({m, grad, compressed, seq});
      return;
    }
    e->received[m.worker]++;
    try {
      apply_push(*e, grad, compressed);
    } catch (...) {
      e->received[m.worker]--;
      return fail(m, Status::from_current_exception());
    }
    e->pushed[m.worker] = 1;
    e->round_pushes.push_back(m);
    e->round_seqs.push_back(seq);
    ++e->pushed_this_round;
    // Async: every push is a round of its own.
    if (!config_.sync || round_ready(*e)) apply_round(part, *e);
  });
}

}  // namespace pushpull::ps
