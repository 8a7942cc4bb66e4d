// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/shm_arena.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <fmt/format.h>

#include "transport/schedule.h"
#include "transport/shm/futex.h"

namespace pushpull::transport {
namespace {

using Clock = std::chrono::steady_clock;

// Busy checks before a waiter yields, and how long it keeps checking
// (yielding between rounds) before it sleeps: ranks of one operation arrive
// within microseconds of each other, and a futex round trip costs tens.
constexpr int kChecksPerRound = 64;
constexpr auto kSpinWindow = std::chrono::microseconds(50);
// Futex sleeps are sliced: a peer that died without a word, and the deadline,
// are noticed within a slice.
constexpr auto kSleepSlice = std::chrono::milliseconds(10);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// memcpy with non-temporal stores: the bytes go to memory, not into this
// core's cache (the peers read them from there). Ordered before the next
// publish() by the fence.
void copy_streaming(char* dst, const char* src, size_t bytes) {
#if defined(__SSE2__)
  size_t i = std::min(bytes, (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
  std::memcpy(dst, src, i);
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  for (; i + 16 <= bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  std::memcpy(dst + i, src + i, bytes - i);
  _mm_sfence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

// CPU time of the calling thread: what an allreduce's copies and
// reductions cost, without the time it waited for peers (which depends on
// what else the host runs at that moment, e.g. a backward pass).
double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

std::optional<SlotStores> parse_slot_stores(std::string_view text) {
  if (text == "auto") return SlotStores::kAuto;
  if (text == "cached") return SlotStores::kCached;
  if (text == "streaming") return SlotStores::kStreaming;
  return std::nullopt;
}

ShmArena::ShmArena(int rank, std::vector<Rank> ranks, size_t slot_bytes, size_t chunk_bytes,
                   Check check, std::function<int(int)> name, SlotStores stores)
    : rank_(rank),
      ranks_(std::move(ranks)),
      slot_bytes_(slot_bytes),
      chunk_bytes_(std::max<size_t>(1, chunk_bytes)),
      check_(std::move(check)),
      name_(std::move(name)),
      stores_(stores),
      // A step's reduced piece is at most max(chunk, one element) bytes.
      scratch_(Shape{static_cast<int64_t>(std::max<size_t>(chunk_bytes_, 64))}, DType::kUInt8) {}

bool ShmArena::pick_streaming() {
  const uint64_t k = tuned_ops_++;
  // The first four alternate; every rank runs the same operations in the
  // same order, so they try the same stores at the same time.
  if (k < 4) return k % 2 == 1;
  const bool best = rate_[1] > rate_[0];
  return k % kRetryEvery == 0 ? !best : best;  // the other one may have become faster
}

void ShmArena::record(bool streaming, double bytes_per_second) {
  double& r = rate_[streaming ? 1 : 0];
  r = r == 0 ? bytes_per_second : 0.75 * r + 0.25 * bytes_per_second;
}

bool ShmArena::handles_allreduce(size_t) const {
  return true;  // in segments
}

void ShmArena::publish(uint64_t phase) {
  ranks_[static_cast<size_t>(rank_)].ctl->phase.store(phase, std::memory_order_seq_cst);
  // Only a peer that said it sleeps needs the system call; one about to
  // sleep re-checks the phases after setting `sleeping` (both seq_cst).
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    ArenaCtl* c = ranks_[static_cast<size_t>(p)].ctl;
    if (c->sleeping.load(std::memory_order_seq_cst)) {
      c->doorbell.fetch_add(1, std::memory_order_seq_cst);
      futex_wake(&c->doorbell);
    }
  }
}

void ShmArena::wake() {
  ArenaCtl* c = ranks_[static_cast<size_t>(rank_)].ctl;
  c->doorbell.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&c->doorbell);
}

void ShmArena::wait_for(int peer, uint64_t phase, Millis timeout, const char* what) {
  const std::atomic<uint64_t>& theirs = ranks_[static_cast<size_t>(peer)].ctl->phase;
  auto reached = [&] { return theirs.load(std::memory_order_acquire) >= phase; };
  for (int i = 0; i < kChecksPerRound; ++i) {
    if (reached()) return;
    cpu_relax();
  }
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  while (Clock::now() - start < kSpinWindow) {
    sched_yield();  // fewer cores than ranks: let the peer run
    for (int i = 0; i < kChecksPerRound; ++i) {
      if (reached()) return;
      cpu_relax();
    }
  }
  ArenaCtl* mine = ranks_[static_cast<size_t>(rank_)].ctl;
  for (;;) {
    const uint32_t bell = mine->doorbell.load(std::memory_order_seq_cst);
    mine->sleeping.store(1, std::memory_order_seq_cst);
    if (theirs.load(std::memory_order_seq_cst) >= phase) {
      mine->sleeping.store(0, std::memory_order_relaxed);
      return;
    }
    futex_wait(&mine->doorbell, bell, kSleepSlice);
    mine->sleeping.store(0, std::memory_order_relaxed);
    if (reached()) return;
    if (Status st = check_(peer); !st.is_ok()) st.raise();
    if (Clock::now() > deadline)
      throw Timeout(fmt::format("collective: rank {} waited {} ms for rank {} ({}, shared memory)",
                                name_(rank_), timeout.count(), name_(peer), what));
  }
}

void ShmArena::wait_all(uint64_t phase, Millis timeout, const char* what) {
  for (int p = 0; p < size(); ++p)
    if (p != rank_) wait_for(p, phase, timeout, what);
}

void ShmArena::barrier(Millis peer_timeout) {
  if (Status st = check_(rank_); !st.is_ok()) st.raise();
  publish(++phase_);
  wait_all(phase_, peer_timeout, "barrier");
}

void ShmArena::allreduce(void* data, size_t count, DType dtype, ReduceOp op, Millis peer_timeout,
                         double postscale) {
  if (count == 0) return;
  if (size() == 1) {
    if (postscale != 1.0) scale(dtype, data, postscale, count);
    return;
  }
  if (Status st = check_(rank_); !st.is_ok()) st.raise();  // this transport closed
  // Slot-sized segments, one after the other: the next one's copies need
  // not wait for the peers still reading this one's slot (two slots).
  const size_t esize = dtype_size(dtype);
  const size_t per_segment = std::max<size_t>(1, slot_bytes_ / esize);
  const size_t total = count * esize;
  const bool tuned = stores_ == SlotStores::kAuto && total >= kTunedBytes;
  const bool streaming = tuned ? pick_streaming() : stores_ == SlotStores::kStreaming;
  const double start = tuned ? thread_cpu_seconds() : 0;
  char* bytes = static_cast<char*>(data);
  for (size_t at = 0; at < count; at += per_segment)
    slot_allreduce(bytes + at * esize, std::min(per_segment, count - at), dtype, op, peer_timeout,
                   postscale, streaming);
  if (tuned) {
    const double seconds = thread_cpu_seconds() - start;
    if (seconds > 0) record(streaming, static_cast<double>(total) / seconds);
  }
}

void ShmArena::slot_allreduce(char* data, size_t count, DType dtype, ReduceOp op, Millis timeout,
                              double postscale, bool streaming) {
  const int n = size();
  const size_t esize = dtype_size(dtype);
  const size_t s = slot_ops_++ % 2;
  auto slot = [&](int r) { return ranks_[static_cast<size_t>(r)].slots + s * slot_bytes_; };
  wait_all(slot_free_[s], timeout, "allreduce: a slot's last readers");
  // A slot mirrors the buffer's layout: block p (of rank p) holds this
  // rank's input for p, and this rank's own block holds its result. Steps
  // go through every block at once, a chunk of each per step, so what a
  // rank copies in is read by its peer while it is still in cache.
  const std::vector<Block> blocks = even_blocks(count, n);
  const size_t per_chunk = std::max<size_t>(1, chunk_bytes_ / esize / static_cast<size_t>(n));
  const size_t steps = (blocks[0].count + per_chunk - 1) / per_chunk;  // block 0 is the largest
  // The elements of block b in step c, as [offset, offset + len).
  auto piece = [&](int b, size_t c, size_t* len) {
    const Block& blk = blocks[static_cast<size_t>(b)];
    const size_t at = std::min(blk.count, c * per_chunk);
    *len = std::min(per_chunk, blk.count - at);
    return (blk.offset + at) * esize;
  };
  // Phases: step c's inputs are in the slots at in(c), its reduced chunk
  // at res(c); in(0) < res(0) < in(1) < ...
  const uint64_t base = phase_;
  phase_ += 2 * steps;
  auto in = [&](size_t c) { return base + 2 * c + 1; };
  auto res = [&](size_t c) { return base + 2 * c + 2; };
  auto copy_inputs = [&](size_t c) {
    for (int p = 0; p < n; ++p) {
      if (p == rank_) continue;
      size_t len;
      const size_t off = piece(p, c, &len);
      if (streaming)
        copy_streaming(slot(rank_) + off, data + off, len * esize);
      else
        std::memcpy(slot(rank_) + off, data + off, len * esize);
    }
    publish(in(c));
  };
  copy_inputs(0);
  for (size_t c = 0; c < steps; ++c) {
    wait_all(in(c), timeout, "allreduce: inputs");
    // This rank's block, reduced in rank order (every rank's input comes
    // from its slot, this rank's own from the buffer) into this rank's
    // slot, where the peers fetch it: every rank gets the same bits.
    size_t len;
    const size_t off = piece(rank_, c, &len);
    if (len > 0) {
      auto src = [&](int q) { return q == rank_ ? data + off : slot(q) + off; };
      char* acc = streaming ? static_cast<char*>(scratch_.data()) : slot(rank_) + off;
      reduce3(op, dtype, acc, src(0), src(1), len);
      for (int q = 2; q < n; ++q)
        reduce(op, dtype, acc, src(q), len);
      if (postscale != 1.0) scale(dtype, acc, postscale, len);
      if (streaming) copy_streaming(slot(rank_) + off, acc, len * esize);
      std::memcpy(data + off, acc, len * esize);
    }
    publish(res(c));
    // The next inputs go out before this rank waits for the peers'
    // results: a peer a little behind has that copy's time to catch up.
    if (c + 1 < steps) copy_inputs(c + 1);
    wait_all(res(c), timeout, "allreduce: reduced blocks");
    for (int p = 0; p < n; ++p) {
      if (p == rank_) continue;
      const size_t at = piece(p, c, &len);
      std::memcpy(data + at, slot(p) + at, len * esize);
    }
  }
  slot_free_[s] = ++phase_;
  publish(slot_free_[s]);
}

}  // namespace pushpull::transport
