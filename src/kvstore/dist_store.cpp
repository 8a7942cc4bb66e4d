// SPDX-License-Identifier: Apache-2.0
#include "kvstore/dist_store.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "base/executor.h"
#include "base/metrics.h"
#include "base/timeline.h"
#include "compress/compressor.h"
#include "kvstore/validate.h"
#include "ps/protocol.h"
#include "pushpull/kernels.h"
#include "pushpull/log.h"

namespace pushpull {

namespace {
uint64_t key_id(const Key& k) {
  return k.is_int() ? static_cast<uint64_t>(k.as_int()) & ~(1ull << 63)
                    : ps::string_key_id(k.as_string());
}

// Whether `conn` is the connection to server `server`.
bool from_server(const cluster::Node& node, net::ConnId conn, int server) {
  try {
    return node.conn(Role::kServer, server) == conn;
  } catch (...) {
    return false;  // that server is gone: its request fails through on_failure
  }
}
}  // namespace

struct DistStore::Pending {
  std::shared_ptr<Completion> done;
  int server = 0;
  std::optional<net::RecvMatch> posted;
  OnData on_data;
  bool command = false;
  // Sends this request again (a new request id) to the current primary.
  std::function<void()> resend;
};

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
                     [this](net::Message&& m) { on_message(std::move(m)); });
  node_->on_peer_failure([this](const Status& s) { on_failure(s); });
  replicas_ = node_->ps_replicas();
  node_->on_placement([this](const cluster::Placement& p) { on_placement(p); });
  try {
    node_->start();
    one_host_ = node_->address_book().one_host;
    if (const int incarnation = node_->incarnation(); incarnation > 0) {
      // A replacement: the servers may still answer requests of the old
      // process to this rank; ids it never used cannot match them.
      next_request_ = (static_cast<uint64_t>(incarnation) << 40) + 1;
      rejoining_ = true;
      PP_WARN(
          "{} worker {} restarted (replacement {}): rejoining the running job; init adopts "
          "the servers' values",
          type_, rank(), incarnation);
      return;
    }
    Status mode;
    if (rank() == 0) {
      try {
        command_all(static_cast<uint64_t>(ps::Command::kSetMode), {sync_ ? "sync" : "async"});
      } catch (...) {
        mode = Status::from_current_exception();
      }
    }
    node_->barrier(cluster::Group::kWorkers);
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

void DistStore::request(int home, net::Header h, const void* data, size_t n,
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
        Pending{done, server, std::nullopt, std::move(on_data), command, std::move(resend)});
  }
  node_->send(
      Role::kServer, server, h, data, n,
      [this, rid, keep_alive](const Status& s) {
        if (!s.is_ok()) finish(rid, s);
      },
      priority);
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
  p->done->finish(s);
}

void DistStore::on_message(net::Message&& m) {
  const net::Header& h = m.header;
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
  for (auto& [rid, p] : failed)
    p->done->finish(s);
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

// ---- init, push, pull ------------------------------------------------------

void DistStore::init(const std::vector<Key>& keys, const std::vector<ArrayView>& values) {
  std::vector<KeyInfo*> made;
  {
    std::lock_guard lock(mu_);
    failure_.raise();
    kv::check_init(type_, keys, values, int_keys_,
                   [&](const Key& k) { return keys_.count(k) != 0; });
    for (size_t i = 0; i < keys.size(); ++i) {
      auto k = std::make_unique<KeyInfo>();
      k->key = keys[i];
      k->id = key_id(keys[i]);
      k->shape = values[i].shape;
      k->dtype = values[i].dtype;
      const auto esize = static_cast<int64_t>(dtype_size(k->dtype));
      auto placed = ps::place(k->id, values[i].numel(), node_->num_servers(), bigarray_bound_);
      // Across hosts at least 32 chunks per slice, of 128 KiB .. chunk_bytes
      // (ps::chunk_count says why). On one host a chunk costs CPU on the same
      // cores, not link time (a message's wake-ups, frames and bookkeeping on
      // both ends), while a pipeline of chunk_bytes fills in about a
      // millisecond at memory speed: slices go in chunks of chunk_bytes.
      const int pieces = one_host_ ? 1 : 32;
      int64_t chunk = ps::chunk_count(placed, std::max<int64_t>(1, chunk_bytes_ / esize),
                                      std::max<int64_t>(1, (128 << 10) / esize), pieces);
      k->slices = ps::chunk(placed, chunk);
      k->push_seq.assign(k->slices.size(), 0);
      made.push_back(k.get());
      keys_.emplace(keys[i], std::move(k));
    }
    int_keys_ = keys.front().is_int();
  }
  if (rejoining_) return rejoin_keys(made, values);
  Status sent;
  if (rank() == 0) {
    size_t parts = 0;
    for (auto* k : made)
      parts += k->slices.size();
    auto done = std::make_shared<Completion>(static_cast<int>(parts));
    for (size_t i = 0; i < made.size(); ++i) {
      KeyInfo& k = *made[i];
      size_t esize = dtype_size(k.dtype);
      auto* base = static_cast<const std::byte*>(values[i].data);
      for (const ps::Slice& s : k.slices) {
        auto payload = std::make_shared<std::vector<std::byte>>(ps::encode_init(
            k.key.to_string(), {base + s.begin * esize, static_cast<size_t>(s.count) * esize},
            s.server));
        net::Header h{.type = ps::msg::kInit,
                      .key = k.id,
                      .dtype = static_cast<uint32_t>(k.dtype),
                      .offset = static_cast<uint64_t>(s.begin),
                      .length = static_cast<uint64_t>(s.count)};
        request(s.server, h, payload->data(), payload->size(), payload, done, 0);
      }
    }
    sent = done->wait_for(wait_timeout());
  }
  node_->barrier(cluster::Group::kWorkers);  // after it, every worker pulls the init value
  sent.raise();
}

void DistStore::rejoin_keys(const std::vector<KeyInfo*>& made,
                            const std::vector<ArrayView>& values) {
  size_t parts = 0;
  for (auto* k : made)
    parts += k->slices.size();
  auto done = std::make_shared<Completion>(static_cast<int>(parts));
  // Per key and slice: the rank's applied push count there.
  auto applied = std::make_shared<std::vector<std::vector<uint64_t>>>(made.size());
  for (size_t i = 0; i < made.size(); ++i) {
    KeyInfo& k = *made[i];
    (*applied)[i].assign(k.slices.size(), 0);
    const size_t esize = dtype_size(k.dtype);
    for (size_t j = 0; j < k.slices.size(); ++j) {
      const ps::Slice s = k.slices[j];
      net::Header h{.type = ps::msg::kPull,
                    .flags = ps::msg::kFlagRejoin,
                    .key = k.id,
                    .dtype = static_cast<uint32_t>(k.dtype),
                    .offset = static_cast<uint64_t>(s.begin),
                    .length = static_cast<uint64_t>(s.count)};
      auto* dst = static_cast<std::byte*>(values[i].data) + static_cast<size_t>(s.begin) * esize;
      const size_t want = static_cast<size_t>(s.count) * esize;
      request(s.server, h, nullptr, 0, nullptr, done, 0,
              [applied, i, j, dst, want](const std::byte* d, size_t n) {
                uint64_t done_seq = 0, accepted = 0;
                if (Status st = ps::decode_rejoin({d, n}, &done_seq, &accepted); !st)
                  throw ProtocolError(st.message());
                if (n - ps::kRejoinHeadBytes != want)
                  throw ProtocolError(fmt::format("rejoin reply holds {} value bytes, expected {}",
                                                  n - ps::kRejoinHeadBytes, want));
                std::memcpy(dst, d + ps::kRejoinHeadBytes, want);
                (*applied)[i][j] = done_seq;
              });
    }
  }
  done->wait_for(wait_timeout()).raise();
  // Rounds every part completed: pushes from here on are numbered after
  // them (a part that is one ahead drops the re-sent push as applied).
  uint64_t round = UINT64_MAX;
  for (const auto& per_key : *applied)
    for (uint64_t a : per_key)
      round = std::min(round, a);
  if (round == UINT64_MAX) round = 0;
  for (auto* k : made) {
    std::lock_guard lock(k->seq_mu);
    k->push_seq.assign(k->slices.size(), round);
  }
  {
    std::lock_guard lock(mu_);
    const auto r = static_cast<int64_t>(round);
    restart_round_ = restart_round_ < 0 ? r : std::min(restart_round_, r);
  }
  PP_WARN("worker {}: rejoined: {} keys adopted from the servers; resuming after round {}", rank(),
          made.size(), round);
}

int64_t DistStore::restart_round() const {
  std::lock_guard lock(mu_);
  return std::max<int64_t>(0, restart_round_);
}

void DistStore::push_key(KeyInfo& k, const ArrayList& values,
                         const std::shared_ptr<Completion>& done, int priority,
                         const ArrayList* pull_into) {
  const size_t n = static_cast<size_t>(k.shape.numel());
  const size_t esize = dtype_size(k.dtype);
  std::shared_ptr<compress::Compressor> compressor;
  {
    std::lock_guard lock(mu_);
    compressor = compressor_;
  }
  // Integer keys travel as they are (set_gradient_compression says so).
  if (!is_floating(k.dtype)) compressor.reset();
  const std::byte* src = static_cast<const std::byte*>(values[0].data);
  std::shared_ptr<net::Buffer> buf;
  std::vector<float> sum32;  // float32 sum when 16-bit or compressing
  if (values.size() > 1 || compressor) {
    if (is_half(k.dtype) || compressor) {
      sum32.resize(n);
      convert(DType::kFloat32, sum32.data(), k.dtype, values[0].data, n);
      std::vector<float> tmp(values.size() > 1 ? n : 0);
      for (size_t d = 1; d < values.size(); ++d) {
        convert(DType::kFloat32, tmp.data(), k.dtype, values[d].data, n);
        reduce_sum(DType::kFloat32, sum32.data(), tmp.data(), n);
      }
    }
    if (!compressor) {
      buf = std::make_shared<net::Buffer>(node_->transport().pool().acquire(n * esize));
      if (is_half(k.dtype)) {
        convert(k.dtype, buf->data(), DType::kFloat32, sum32.data(), n);
      } else {
        copy(k.dtype, buf->data(), values[0].data, n);
        for (size_t d = 1; d < values.size(); ++d)
          reduce_sum(k.dtype, buf->data(), values[d].data, n);
      }
      src = buf->data();
    }
  }
  if (compressor) {  // one buffer: each slice's wire form, in slice order
    size_t total = 0;
    for (const auto& s : k.slices)
      total += compressor->encoded_bytes(static_cast<size_t>(s.count));
    buf = std::make_shared<net::Buffer>(node_->transport().pool().acquire(total));
    // The residual belongs to the key and the device the sum was formed on.
    const int device = values[0].device.id;
    std::byte* out = buf->data();
    for (const auto& s : k.slices) {
      const auto at = static_cast<size_t>(s.begin), count = static_cast<size_t>(s.count);
      compressor->encode(k.id, device, n, at, sum32.data() + at, count, out);
      out += compressor->encoded_bytes(count);
    }
  }
  uint64_t base_offset = 0;
  std::vector<uint64_t> seqs(k.slices.size());
  {
    // Each slice's pushes are numbered (the server drops one it applied).
    std::lock_guard lock(k.seq_mu);
    for (size_t i = 0; i < seqs.size(); ++i)
      seqs[i] = ++k.push_seq[i];
  }
  for (size_t i = 0; i < k.slices.size(); ++i) {
    const ps::Slice& s = k.slices[i];
    net::Header h{.type = ps::msg::kPush,
                  .flags = (compressor ? ps::msg::kFlagCompressed : 0u) |
                           (pull_into ? ps::msg::kFlagPullBack : 0u),
                  .key = k.id,
                  .dtype = ps::dtype_field(static_cast<uint32_t>(k.dtype), seqs[i]),
                  .offset = static_cast<uint64_t>(s.begin),
                  .length = static_cast<uint64_t>(s.count)};
    const std::byte* data = src + s.begin * esize;
    size_t bytes = static_cast<size_t>(s.count) * esize;
    if (compressor) {
      data = buf->data() + base_offset;
      bytes = compressor->encoded_bytes(static_cast<size_t>(s.count));
      base_offset += bytes;
    }
    if (pull_into)
      value_request(k, s, h, data, bytes, buf, *pull_into, done, priority);
    else
      request(s.server, h, data, bytes, buf, done, priority);
  }
}

void DistStore::pull_slice(KeyInfo& k, const ps::Slice& s, const ArrayList& outs,
                           const std::shared_ptr<Completion>& done, int priority) {
  net::Header h{.type = ps::msg::kPull,
                .key = k.id,
                .dtype = static_cast<uint32_t>(k.dtype),
                .offset = static_cast<uint64_t>(s.begin),
                .length = static_cast<uint64_t>(s.count)};
  value_request(k, s, h, nullptr, 0, nullptr, outs, done, priority);
}

void DistStore::value_request(KeyInfo& k, const ps::Slice& s, net::Header h, const void* data,
                              size_t n, std::shared_ptr<void> keep_alive, const ArrayList& outs,
                              const std::shared_ptr<Completion>& done, int priority) {
  const size_t esize = dtype_size(k.dtype);
  const size_t bytes = static_cast<size_t>(s.count) * esize;
  const size_t at = static_cast<size_t>(s.begin) * esize;
  uint64_t rid = next_request_++;
  requests_sent_.fetch_add(1, std::memory_order_relaxed);
  net::RecvMatch match{ps::msg::kReply, rid, k.id};
  PP_METRIC_ADD(kPsRequests, 1), PP_METRIC_ADD(kPsBytes, n + bytes);  // metrics hook
  PP_TIMELINE_ASYNC_BEGIN(timeline::process_node(), n > 0 ? "PUSHPULL" : "PULL", rid,
                          static_cast<int64_t>(k.id),
                          static_cast<int64_t>(n + bytes));  // timeline hook
  int server;
  uint64_t epoch;
  {
    std::lock_guard lock(mu_);
    if (!failure_.is_ok()) return done->finish(failure_);
    server = primary_of(s.server);
    epoch = placement_.epoch;
    pending_[rid] = std::make_unique<Pending>(
        Pending{done, server, match, {}, false, [=, this, &k] {
                  value_request(k, s, h, data, n, keep_alive, outs, done, priority);
                }});
  }
  auto* dst = static_cast<std::byte*>(outs[0].data) + at;
  Status posted = node_->post_recv(
      Role::kServer, server, match, dst, bytes,
      [this, rid, outs, at, bytes](const Status& st, const net::Header& reply) {
        Status result = st;
        if (result.is_ok() && reply.payload_bytes != bytes)
          result = Status(
              ErrorCode::kProtocolError,
              fmt::format("pull reply has {} bytes, expected {}", reply.payload_bytes, bytes));
        if (result.is_ok())
          for (size_t d = 1; d < outs.size(); ++d)
            std::memcpy(static_cast<std::byte*>(outs[d].data) + at,
                        static_cast<const std::byte*>(outs[0].data) + at, bytes);
        finish(rid, result);
      });
  if (!posted.is_ok()) return finish(rid, posted);
  h.request_id = rid;
  h.flags |= ps::epoch_flags(epoch);
  if (n > 0) {  // a push: its bytes are sent from where they are (kept alive until written)
    node_->send(
        Role::kServer, server, h, data, n,
        [this, rid, server, match, keep_alive](const Status& st) {
          if (st.is_ok()) return;
          cancel_posted(server, match);
          finish(rid, st);
        },
        priority);
    return;
  }
  Status sent = node_->send_copy(Role::kServer, server, h, nullptr, 0, priority);
  if (!sent.is_ok()) {
    cancel_posted(server, match);
    finish(rid, sent);
  }
}

void DistStore::cancel_posted(int server, const net::RecvMatch& match) {
  try {
    node_->transport().cancel_recv(node_->conn(Role::kServer, server), match);
  } catch (...) {  // that server is gone: its posted receive went with it
  }
}

KVHandle DistStore::push_async(const std::vector<Key>& keys, const std::vector<ArrayList>& values,
                               int priority) {
  return pushpull_async(keys, values, {}, priority);
}

KVHandle DistStore::pull_async(const std::vector<Key>& keys, const std::vector<ArrayList>& outs,
                               int priority) {
  return pushpull_async(keys, {}, outs, priority);
}

// push, pull and pushpull in one: `values` or `outs` may be empty (not both).
KVHandle DistStore::pushpull_async(const std::vector<Key>& keys,
                                   const std::vector<ArrayList>& values,
                                   const std::vector<ArrayList>& outs, int priority) {
  const char* op = values.empty() ? "pull" : (outs.empty() ? "push" : "pushpull");
  rejoining_ = false;  // a restarted worker trains with the others from here
  std::vector<KeyInfo*> ks = infos(op, keys, values.empty() ? outs.size() : values.size());
  if (!values.empty() && !outs.empty()) kv::check_counts(op, keys.size(), outs.size());
  size_t parts = 0;
  for (size_t i = 0; i < ks.size(); ++i) {
    if (!values.empty())
      kv::check_list(op, type_, ks[i]->key, ks[i]->shape, ks[i]->dtype, values[i], "value");
    if (!outs.empty())
      kv::check_list(op, type_, ks[i]->key, ks[i]->shape, ks[i]->dtype, outs[i], "output");
    // A pushpull's slice is one request (a push answered with the value).
    parts += ks[i]->slices.size();
  }
  auto done = std::make_shared<Completion>(static_cast<int>(parts));
  for (size_t i = 0; i < ks.size(); ++i) {
    if (!values.empty() && !outs.empty()) {  // each slice's push answered with its value
      push_key(*ks[i], values[i], done, priority, &outs[i]);
      continue;
    }
    if (!values.empty()) push_key(*ks[i], values[i], done, priority);
    if (!outs.empty())
      for (const auto& s : ks[i]->slices)
        pull_slice(*ks[i], s, outs[i], done, priority);
  }
  return KVHandle(done);
}

KVHandle DistStore::row_sparse_pull_async(const Key& key, const ArrayList& outs,
                                          const ArrayView& row_ids, int priority) {
  KeyInfo* k = infos("row_sparse_pull", {key}, 1).front();
  if (k->shape.ndim() < 1)
    throw InvalidArgument(fmt::format("row_sparse_pull of key {}: the value {} has no rows",
                                      key.to_string(), k->shape.to_string()));
  kv::check_list("row_sparse_pull", type_, key, k->shape, k->dtype, outs, "output");
  const int64_t rows = k->shape[0];
  const int64_t row_len = rows ? k->shape.numel() / rows : 0;
  std::vector<int64_t> ids = kv::check_row_ids(key, row_ids, rows);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const size_t esize = dtype_size(k->dtype);
  for (const auto& o : outs)
    std::memset(o.data, 0, o.nbytes());  // rows not asked for are zero

  struct Ask {
    ps::Slice slice;
    std::vector<ps::Range> ranges;
  };
  std::vector<Ask> asks;
  for (const auto& s : k->slices) {
    Ask a{s, {}};
    for (int64_t r : ids) {
      int64_t lo = std::max(r * row_len, s.begin),
              hi = std::min((r + 1) * row_len, s.begin + s.count);
      if (hi > lo) a.ranges.push_back({lo - s.begin, hi - lo});
    }
    if (!a.ranges.empty()) asks.push_back(std::move(a));
  }
  auto done = std::make_shared<Completion>(static_cast<int>(asks.size()));
  for (auto& a : asks) {
    auto payload = std::make_shared<std::vector<std::byte>>(ps::encode_ranges(a.ranges));
    net::Header h{.type = ps::msg::kPull,
                  .key = k->id,
                  .dtype = static_cast<uint32_t>(k->dtype),
                  .offset = static_cast<uint64_t>(a.slice.begin),
                  .length = static_cast<uint64_t>(a.slice.count)};
    request(a.slice.server, h, payload->data(), payload->size(), payload, done, priority,
            [outs, a, esize](const std::byte* d, size_t n) {
              size_t want = 0;
              for (const auto& r : a.ranges)
                want += static_cast<size_t>(r.count) * esize;
              if (n != want)
                throw ProtocolError(
                    fmt::format("row_sparse_pull reply has {} bytes, expected {}", n, want));
              for (const auto& r : a.ranges) {
                size_t at = static_cast<size_t>(a.slice.begin + r.begin) * esize;
                size_t len = static_cast<size_t>(r.count) * esize;
                for (const auto& o : outs)
                  std::memcpy(static_cast<std::byte*>(o.data) + at, d, len);
                d += len;
              }
            });
  }
  return KVHandle(done);
}

void DistStore::wait_all() {
  std::unique_lock lock(mu_);
  if (!idle_cv_.wait_for(lock, wait_timeout(), [&] { return pending_.empty(); }))
    throw Timeout(fmt::format("wait_all: {} requests to the servers still unanswered after {} ms",
                              pending_.size(), wait_timeout().count()));
  failure_.raise();
}

void DistStore::barrier() {
  check_failure();
  if (rejoining_) return;  // a restarted worker: the others passed it long ago
  node_->barrier(cluster::Group::kWorkers);
}

}  // namespace pushpull
