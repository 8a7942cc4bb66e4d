// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/shm_transport_impl.h"

#include <sched.h>
#include <signal.h>

#include <cerrno>
#include <cstring>

namespace pushpull::transport {

bool ShmTransport::Impl::write_some(int p, Done& done) {
  auto& q = sendq[static_cast<size_t>(p)];
  if (q.empty()) return false;
  Map& m = map(p);
  RingCtl& c = m.ctl[rank];
  const transport::ShmRing r = ring(p, rank);
  uint64_t head = c.head.load(std::memory_order_relaxed);
  uint64_t space = r.free(head, c.tail.load(std::memory_order_acquire));
  bool moved = false;
  while (!q.empty() && space > 0) {
    SendOp& op = q.front();
    while (op.done < 16 + op.bytes && space > 0) {
      const char* src;
      size_t n;
      if (op.done < 16) {
        src = reinterpret_cast<const char*>(op.hdr) + op.done;
        n = 16 - op.done;
      } else {
        src = op.data + (op.done - 16);
        n = op.bytes - (op.done - 16);
      }
      n = std::min(n, static_cast<size_t>(space));
      r.copy_in(head, src, n);
      head += n;
      space -= n;
      op.done += n;
      moved = true;
    }
    if (op.done < 16 + op.bytes) break;
    done.emplace_back(std::move(op.cb), Status::ok());
    q.pop_front();
  }
  if (moved) {
    c.head.store(head, std::memory_order_release);
    ring_bell(m.h);
  }
  return moved;
}

Status ShmTransport::Impl::gone(int p, const std::string& why) const {
  return Status(ErrorCode::kPeerFailure,
                fmt::format("collective: rank {} is gone ({})", name(p), why));
}

void ShmTransport::Impl::match(int p, Incoming& in, Done& done) {
  in.tag = transport::load_le<uint64_t>(in.hdr);
  in.bytes = transport::load_le<uint64_t>(in.hdr + 8);
  in.got = 0;
  if (in.bytes > kMaxMessageBytes)
    throw ProtocolError(
        fmt::format("collective shm: rank {} announced a message of {} bytes", name(p), in.bytes));
  std::lock_guard lock(mu);
  auto it = posted.find({p, in.tag});
  if (it != posted.end() && !it->second.empty()) {
    RecvOp r = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) posted.erase(it);
    if (r.bytes != in.bytes) {
      in.error = mismatch(in.bytes, in.tag, r.bytes);
      done.emplace_back(std::move(r.cb), in.error);
      return;
    }
    in.target = std::move(r);
    return;
  }
  auto& eb = early_bytes[static_cast<size_t>(p)];
  if (eb + in.bytes > o.max_early_bytes)
    throw ProtocolError(
        fmt::format("collective shm: rank {} sent {} bytes nobody asked for yet (limit {})",
                    name(p), eb + in.bytes, o.max_early_bytes));
  eb += in.bytes;
  in.early = std::make_shared<Early>();
  in.early->buf.resize(in.bytes);
  early[{p, in.tag}].push_back(in.early);
}

Status ShmTransport::Impl::mismatch(uint64_t got, uint64_t tag, uint64_t want) {
  return Status(ErrorCode::kProtocolError,
                fmt::format("collective: message of {} bytes (tag {:#x}) for a receive of {} "
                            "bytes; the ranks disagree about the operation",
                            got, tag, want));
}

void ShmTransport::Impl::message_done(int p, Incoming& in, Done& done) {
  if (in.target) {
    done.emplace_back(std::move(in.target->cb), Status::ok());
  } else if (in.early) {
    std::lock_guard lock(mu);
    in.early->complete = true;
    if (in.early->claim) {  // posted while arriving: it owns the message now
      RecvOp r = std::move(*in.early->claim);
      if (r.bytes) std::memcpy(r.dst, in.early->buf.data(), r.bytes);
      early_bytes[static_cast<size_t>(p)] -= in.bytes;
      auto& q = early[{p, in.tag}];
      if (!q.empty() && q.front() == in.early) q.pop_front();
      if (q.empty()) early.erase({p, in.tag});
      done.emplace_back(std::move(r.cb), Status::ok());
    }
  }
  in = Incoming{};
}

bool ShmTransport::Impl::read_some(int p, Done& done) {
  RingCtl& c = map(rank).ctl[p];
  const transport::ShmRing r = ring(rank, p);
  const uint64_t head = c.head.load(std::memory_order_acquire);
  uint64_t tail = c.tail.load(std::memory_order_relaxed);
  if (head == tail) return false;
  if (transport::ShmRing::used(head, tail) > o.ring_bytes)
    throw ProtocolError(fmt::format("collective shm: rank {}'s ring is corrupt", name(p)));
  Incoming& in = incoming[static_cast<size_t>(p)];
  auto copy_out = [&](char* dst, size_t n) {  // n bytes from the ring at tail (null: dropped)
    r.copy_out(tail, dst, n);
    tail += n;
  };
  while (tail < head) {
    if (in.hdr_got < 16) {
      size_t n = std::min<uint64_t>(16 - in.hdr_got, head - tail);
      copy_out(reinterpret_cast<char*>(in.hdr) + in.hdr_got, n);
      in.hdr_got += n;
      if (in.hdr_got < 16) break;
      match(p, in, done);
      if (in.bytes == 0) {
        message_done(p, in, done);
        continue;
      }
    }
    size_t n = static_cast<size_t>(std::min<uint64_t>(in.bytes - in.got, head - tail));
    char* dst = in.target  ? in.target->dst + in.got
                : in.early ? in.early->buf.data() + in.got
                           : nullptr;  // discarded (size mismatch)
    copy_out(dst, n);
    in.got += n;
    if (in.got == in.bytes) message_done(p, in, done);
  }
  c.tail.store(tail, std::memory_order_release);
  ring_bell(map(p).h);  // space for the writer
  return true;
}

// A local safety net under the mesh's detector (transport/liveness.h), not
// a detector: a same-host peer's closed flag or gone pid fails its
// operations before the mesh's verdict (the group's culprit) arrives.
bool ShmTransport::Impl::peer_alive(int p) {
  SegHeader* h = map(p).h;
  if (h->closed.load(std::memory_order_acquire)) return false;
  return !transport::process_gone(h->pid.load());
}

void ShmTransport::Impl::fail_peer(int p, const Status& why, Done& done) {
  failed[static_cast<size_t>(p)] = true;
  {
    std::lock_guard lock(mu);
    if (dead[static_cast<size_t>(p)]) return;
    dead[static_cast<size_t>(p)] = why;
    for (auto it = posted.begin(); it != posted.end();) {
      if (it->first.first != p) {
        ++it;
        continue;
      }
      for (auto& r : it->second)
        done.emplace_back(std::move(r.cb), why);
      it = posted.erase(it);
    }
    for (auto it = early.begin(); it != early.end();) {
      if (it->first.first != p) {
        ++it;
        continue;
      }
      // Complete early messages stay: a receive posted later still gets
      // them (the peer sent them before it went). One still arriving is lost.
      auto& q = it->second;
      if (!q.empty() && !q.back()->complete) {
        if (q.back()->claim) done.emplace_back(std::move(q.back()->claim->cb), why);
        early_bytes[static_cast<size_t>(p)] -= q.back()->buf.size();
        q.pop_back();
      }
      it = q.empty() ? early.erase(it) : std::next(it);
    }
  }
  Incoming& in = incoming[static_cast<size_t>(p)];
  if (in.target) done.emplace_back(std::move(in.target->cb), why);
  in = Incoming{};
  std::lock_guard lock(send_mu);
  for (auto& s : sendq[static_cast<size_t>(p)])
    done.emplace_back(std::move(s.cb), why);
  sendq[static_cast<size_t>(p)].clear();
}

void ShmTransport::Impl::check_peers(Done& done) {
  for (int p = 0; p < size; ++p) {
    if (p == rank || failed[static_cast<size_t>(p)]) continue;
    if (!peer_alive(p)) {
      // Deliver what it wrote before it went, then fail the rest.
      try {
        read_some(p, done);
      } catch (const Error& e) {
        fail_peer(p, Status(e.code(), e.what()), done);
        continue;
      }
      fail_peer(p, gone(p, map(p).h->closed.load() ? "closed" : "its process exited"), done);
    }
  }
}

void ShmTransport::Impl::run(Done& done) {
  for (auto& [cb, st] : done)
    cb(st);
  done.clear();
}

void ShmTransport::Impl::loop() {
  Done done;
  SegHeader* own = map(rank).h;
  auto spin_until = Clock::now();
  auto next_check = Clock::now();
  while (!stop.load(std::memory_order_acquire)) {
    const uint32_t bell = own->doorbell.load(std::memory_order_acquire);
    bool moved = false;
    for (int p = 0; p < size; ++p) {
      if (p == rank || failed[static_cast<size_t>(p)]) continue;
      try {
        {
          std::lock_guard lock(send_mu);
          moved |= write_some(p, done);
        }
        moved |= read_some(p, done);
      } catch (const Error& e) {  // a malformed ring: that peer is broken
        fail_peer(p, Status(e.code(), e.what()), done);
      }
    }
    auto now = Clock::now();
    if (now >= next_check) {
      check_peers(done);
      next_check = now + kSleepSlice;
    }
    run(done);
    if (moved) {
      spin_until = Clock::now() + kSpinWindow;
      continue;
    }
    if (Clock::now() < spin_until) {
      sched_yield();
      continue;
    }
    own->sleeping.store(1, std::memory_order_seq_cst);
    futex_wait(&own->doorbell, bell, kSleepSlice);
    own->sleeping.store(0, std::memory_order_relaxed);
  }
}

}  // namespace pushpull::transport
