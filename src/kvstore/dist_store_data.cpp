// SPDX-License-Identifier: Apache-2.0
// The DistStore's data path: init, push, pull and pushpull, cut into
// per-chunk requests (dist_store.cpp sends them and routes the replies;
// dist_store_rows.cpp: row_sparse_pull).
#include "kvstore/dist_store.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

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
}  // namespace

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
      auto placed = ps::place(k->id, values[i].numel(), node_->num_servers(), bigarray_bound_,
                              server_weights_);
      // Across hosts at least 128 chunks per slice, of 64 KiB .. chunk_bytes
      // (ps::chunk_count says why; the fill and drain of the push->reply
      // pipeline are about one chunk each: with mixed placement, 8 workers
      // and 4 spare hosts at 500 Mbit/s, 40 MiB took 1.11x BytePS's bound
      // in chunks of 100-200 KiB, 1.09x in 64 KiB ones). On one host a chunk
      // costs CPU on the same cores, not link time (a message's wake-ups,
      // frames and bookkeeping on both ends), while a pipeline of chunk_bytes
      // fills in about a millisecond at memory speed: slices go in chunks of
      // chunk_bytes.
      const int pieces = one_host_ ? 1 : 128;
      int64_t chunk = ps::chunk_count(placed, std::max<int64_t>(1, chunk_bytes_ / esize),
                                      std::max<int64_t>(1, (64 << 10) / esize), pieces);
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
        transport::Header h{.type = ps::msg::kInit,
                            .key = k.id,
                            .dtype = static_cast<uint32_t>(k.dtype),
                            .offset = static_cast<uint64_t>(s.begin),
                            .length = static_cast<uint64_t>(s.count)};
        request(s.server, h, payload->data(), payload->size(), payload, done, 0);
      }
    }
    sent = done->wait_for(wait_timeout());
  }
  workers_barrier();  // after it, every worker pulls the init value
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
      transport::Header h{.type = ps::msg::kPull,
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
    pushes_issued_ += round * made.size();  // its predecessor's, as the others count them
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
  std::shared_ptr<transport::Buffer> buf;
  std::vector<float> sum32;  // float32 sum when 16-bit or compressing
  // One float32 array is encoded straight from the caller's memory.
  const bool direct = compressor && values.size() == 1 && k.dtype == DType::kFloat32;
  if (values.size() > 1 || (compressor && !direct)) {
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
      buf = std::make_shared<transport::Buffer>(node_->transport().pool().acquire(n * esize));
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
  // Compressed: one buffer holds each slice's wire form, in slice order. A
  // slice is encoded right before it is sent, so the link starts on the
  // first while the others are encoded (the first is encoded before the
  // sequence numbers are taken: a bad push throws with nothing sent).
  std::vector<size_t> wire_at;
  const float* grad = direct ? static_cast<const float*>(values[0].data) : sum32.data();
  const int device = values[0].device.id;  // the residual's: where the sum was formed
  auto encode_slice = [&](size_t i) {
    const auto at = static_cast<size_t>(k.slices[i].begin);
    const auto count = static_cast<size_t>(k.slices[i].count);
    compressor->encode(k.id, device, n, at, grad + at, count, buf->data() + wire_at[i]);
  };
  if (compressor) {
    size_t total = 0;
    for (const auto& s : k.slices) {
      wire_at.push_back(total);
      total += compressor->encoded_bytes(static_cast<size_t>(s.count));
    }
    buf = std::make_shared<transport::Buffer>(node_->transport().pool().acquire(total));
    if (!k.slices.empty()) encode_slice(0);
  }
  std::vector<uint64_t> seqs(k.slices.size());
  {
    // Each slice's pushes are numbered (the server drops one it applied).
    std::lock_guard lock(k.seq_mu);
    for (size_t i = 0; i < seqs.size(); ++i)
      seqs[i] = ++k.push_seq[i];
  }
  for (size_t i = 0; i < k.slices.size(); ++i) {
    const ps::Slice& s = k.slices[i];
    transport::Header h{.type = ps::msg::kPush,
                        .flags = (compressor ? ps::msg::kFlagCompressed : 0u) |
                                 (pull_into ? ps::msg::kFlagPullBack : 0u),
                        .key = k.id,
                        .dtype = ps::dtype_field(static_cast<uint32_t>(k.dtype), seqs[i]),
                        .offset = static_cast<uint64_t>(s.begin),
                        .length = static_cast<uint64_t>(s.count)};
    const std::byte* data = src + s.begin * esize;
    size_t bytes = static_cast<size_t>(s.count) * esize;
    if (compressor) {
      if (i > 0) encode_slice(i);
      data = buf->data() + wire_at[i];
      bytes = compressor->encoded_bytes(static_cast<size_t>(s.count));
    }
    if (pull_into)
      value_request(k, s, h, data, bytes, buf, *pull_into, done, priority);
    else
      request(s.server, h, data, bytes, buf, done, priority);
  }
}

void DistStore::pull_slice(KeyInfo& k, const ps::Slice& s, const ArrayList& outs,
                           const std::shared_ptr<Completion>& done, int priority) {
  transport::Header h{.type = ps::msg::kPull,
                      .key = k.id,
                      .dtype = static_cast<uint32_t>(k.dtype),
                      .offset = static_cast<uint64_t>(s.begin),
                      .length = static_cast<uint64_t>(s.count)};
  value_request(k, s, h, nullptr, 0, nullptr, outs, done, priority);
}

void DistStore::value_request(KeyInfo& k, const ps::Slice& s, transport::Header h, const void* data,
                              size_t n, std::shared_ptr<void> keep_alive, const ArrayList& outs,
                              const std::shared_ptr<Completion>& done, int priority) {
  const size_t esize = dtype_size(k.dtype);
  const size_t bytes = static_cast<size_t>(s.count) * esize;
  const size_t at = static_cast<size_t>(s.begin) * esize;
  uint64_t rid = next_request_++;
  requests_sent_.fetch_add(1, std::memory_order_relaxed);
  transport::RecvMatch match{ps::msg::kReply, rid, k.id};
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
    pending_[rid] = std::make_unique<Pending>(Pending{
        done,
        server,
        match,
        {},
        false,
        [=, this, &k] { value_request(k, s, h, data, n, keep_alive, outs, done, priority); },
        flight_record(n > 0 ? "pushpull" : "pull", k.id, n + bytes)});
  }
  auto* dst = static_cast<std::byte*>(outs[0].data) + at;
  // A float32 slice may come back compressed (docs/kvstore.md "Compressed
  // pulls"): fewer bytes, a compress/compressor.h wire form, decoded where
  // they landed.
  const bool may_compress = k.dtype == DType::kFloat32;
  Status posted = node_->post_recv(
      Role::kServer, server, match, dst, bytes,
      [this, rid, outs, at, bytes, dst, may_compress](const Status& st,
                                                      const transport::Header& reply) {
        Status result = st;
        if (result.is_ok() && reply.payload_bytes != bytes) {
          if (may_compress && reply.payload_bytes < bytes)
            result = compress::decode_in_place(dst, reply.payload_bytes, bytes / sizeof(float));
          else
            result = Status(
                ErrorCode::kProtocolError,
                fmt::format("pull reply has {} bytes, expected {}", reply.payload_bytes, bytes));
          if (result.is_ok()) pulled_compressed_.fetch_add(1, std::memory_order_relaxed);
        }
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

void DistStore::cancel_posted(int server, const transport::RecvMatch& match) {
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
  if (!values.empty()) {
    bool pass = false;
    uint64_t position;
    {
      std::lock_guard lock(mu_);
      position = pushes_issued_;
      pushes_issued_ += keys.size();
      std::swap(pass, pass_due_);
    }
    // A replacement's first push: it will not call a barrier at the position
    // it resumed from, so the others must not wait for it there.
    if (pass) node_->pass_barriers(position);
  }
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

}  // namespace pushpull
