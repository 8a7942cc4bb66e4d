// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/shm_transport_impl.h"

#include <algorithm>
#include <cstring>

namespace pushpull::transport {

bool ShmTransport::Impl::check_post(int peer, Completion& cb, bool peer_too) {
  Status st;
  if (peer < 0 || peer >= size || peer == rank) {
    st = Status(ErrorCode::kInvalidArgument,
                fmt::format("collective: rank {} cannot post to rank {} (size {})", name(rank),
                            peer, size));
  } else {
    std::lock_guard lock(mu);
    if (closed)
      st = *closed;
    else if (peer_too && dead[static_cast<size_t>(peer)])
      st = *dead[static_cast<size_t>(peer)];
  }
  if (st.is_ok()) return true;
  cb(st);
  return false;
}

void ShmTransport::Impl::post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                                   Completion cb) {
  if (!check_post(peer, cb)) return;
  SendOp op;
  transport::store_le<uint64_t>(op.hdr, tag);
  transport::store_le<uint64_t>(op.hdr + 8, bytes);
  op.data = static_cast<const char*>(data);
  op.bytes = bytes;
  op.cb = std::move(cb);
  Done done;
  bool queued = false;
  {
    std::lock_guard lock(send_mu);
    auto& q = sendq[static_cast<size_t>(peer)];
    if (closing) {  // close() started after check_post: it will not drain this one
      done.emplace_back(std::move(op.cb),
                        Status(ErrorCode::kIoError, "collective: shm transport closed"));
    } else {
      q.push_back(std::move(op));
      if (q.size() == 1) write_some(peer, done);  // nothing ahead: straight into the ring
      queued = !q.empty();
    }
  }
  if (queued) wake_self();  // the progress thread writes the rest as space frees
  run(done);
}

void ShmTransport::Impl::post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion cb) {
  if (!check_post(peer, cb, false)) return;
  RecvOp r{static_cast<char*>(dst), bytes, std::move(cb)};
  std::unique_lock lock(mu);
  auto it = early.find({peer, tag});
  if (it != early.end()) {
    // The oldest early message with this tag is this receive's.
    for (auto& e : it->second) {
      if (e->claim) continue;
      if (!e->complete) {
        e->claim = std::move(r);
        if (e->claim->bytes != e->buf.size()) {
          Completion c = std::move(e->claim->cb);
          Status st = mismatch(e->buf.size(), tag, bytes);
          e->claim.reset();
          lock.unlock();
          c(st);
        }
        return;
      }
      std::shared_ptr<Early> msg = e;
      it->second.pop_front();  // complete ones are at the front (FIFO)
      if (it->second.empty()) early.erase(it);
      early_bytes[static_cast<size_t>(peer)] -= msg->buf.size();
      lock.unlock();
      if (msg->buf.size() != bytes) {
        r.cb(mismatch(msg->buf.size(), tag, bytes));
        return;
      }
      if (bytes) std::memcpy(dst, msg->buf.data(), bytes);
      r.cb(Status::ok());
      return;
    }
  }
  if (closed || dead[static_cast<size_t>(peer)]) {
    Status st = closed ? *closed : *dead[static_cast<size_t>(peer)];
    lock.unlock();
    r.cb(st);
    return;
  }
  posted[{peer, tag}].push_back(std::move(r));
}

void ShmTransport::Impl::close(const Status& reason, bool tell) {
  bool first;
  {
    std::lock_guard lock(mu);
    first = !closed;
    if (first) closed = reason;
  }
  {
    std::lock_guard lock(send_mu);  // posts after this see it (post_send)
    closing = true;
  }
  stop.store(true, std::memory_order_release);
  {
    std::lock_guard lock(join_mu);
    if (maps[static_cast<size_t>(rank)].h) wake_self();
    if (arena) arena->wake();  // its waiter sees `closed` now
    if (progress.joinable() && progress.get_id() != std::this_thread::get_id()) progress.join();
    if (tell && !told && maps[static_cast<size_t>(rank)].h) {
      told = true;
      map(rank).h->closed.store(1, std::memory_order_release);
      for (int p = 0; p < size; ++p)
        if (p != rank && map(p).h) ring_bell(map(p).h);
    }
  }
  if (!first) return;  // the first call failed what was pending
  Done done;
  {
    std::lock_guard lock(mu);
    for (auto& [k, q] : posted)
      for (auto& r : q)
        done.emplace_back(std::move(r.cb), reason);
    posted.clear();
    for (auto& [k, q] : early)
      for (auto& e : q)
        if (e->claim) done.emplace_back(std::move(e->claim->cb), reason);
    early.clear();
  }
  for (auto& in : incoming) {
    if (in.target) done.emplace_back(std::move(in.target->cb), reason);
    in = Incoming{};
  }
  {
    std::lock_guard lock(send_mu);
    for (auto& q : sendq) {
      for (auto& s : q)
        done.emplace_back(std::move(s.cb), reason);
      q.clear();
    }
  }
  run(done);
}

ShmTransport::ShmTransport(int rank, int size, const std::string& prefix, ShmOptions options,
                           const std::string& dir) {
  if (size < 1 || rank < 0 || rank >= size)
    throw InvalidArgument(fmt::format("ShmTransport: rank {} of size {}", rank, size));
  if (prefix.empty() || prefix.find('/') != std::string::npos)
    throw InvalidArgument(fmt::format("ShmTransport: bad segment prefix '{}'", prefix));
  if (!options.rank_names.empty() && options.rank_names.size() != static_cast<size_t>(size))
    throw InvalidArgument(
        fmt::format("ShmTransport: {} rank names for size {}", options.rank_names.size(), size));
  if (!options.segment_names.empty()) {
    if (options.segment_names.size() != static_cast<size_t>(size))
      throw InvalidArgument(fmt::format("ShmTransport: {} segment names for size {}",
                                        options.segment_names.size(), size));
    for (const auto& n : options.segment_names)
      if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos)
        throw InvalidArgument(fmt::format("ShmTransport: bad segment name '{}'", n));
  }
  if (options.ring_bytes < 4096)
    throw InvalidArgument("ShmTransport: ring_bytes must be at least 4096");
  if (options.arena_slot_bytes > UINT32_MAX)
    throw InvalidArgument("ShmTransport: arena_slot_bytes must be below 4 GiB");
  impl_ = std::make_unique<Impl>(rank, size, prefix, options, dir);
  impl_->setup();
  impl_->progress = std::thread([this] { impl_->loop(); });
}

size_t ring_bytes_for_ranks(size_t max_ring, size_t ranks) {
  if (ranks < 2) return max_ring;
  const uint64_t share = kShmHostRingBudget / (static_cast<uint64_t>(ranks) * (ranks - 1));
  if (share >= max_ring) return max_ring;
  return std::max<size_t>(kShmMinDataRingBytes, static_cast<size_t>(share) & ~size_t{4095});
}

ShmTransport::~ShmTransport() {
  close(Status(ErrorCode::kPeerFailure,
               fmt::format("collective: rank {} closed its shared-memory transport",
                           impl_->name(impl_->rank))));
}

int ShmTransport::rank() const {
  return impl_->rank;
}
int ShmTransport::size() const {
  return impl_->size;
}
void ShmTransport::post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                             Completion done) {
  impl_->post_send(peer, tag, data, bytes, std::move(done));
}
void ShmTransport::post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) {
  impl_->post_recv(peer, tag, dst, bytes, std::move(done));
}
void ShmTransport::close(const Status& reason) {
  impl_->close(reason);
}
HostCollectives* ShmTransport::host_collectives() {
  return impl_->arena.get();
}
void ShmTransport::declare(const Status& verdict) {
  impl_->close(verdict, false);
}

}  // namespace pushpull::transport
