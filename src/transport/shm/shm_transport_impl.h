// SPDX-License-Identifier: Apache-2.0
// ShmTransport's private parts (shm_transport.h): the segment's layout and
// the Impl every shm_transport*.cpp shares. Not installed; only those files
// include it.
//
// - shm_transport_setup.cpp: creating, sizing and mapping the segments;
// - shm_transport_progress.cpp: the progress thread (rings in and out, peers
//   that closed or died);
// - shm_transport.cpp: posting, close() and the public class.
//
// Thread safety: as ShmTransport's; each member says which lock or thread
// guards it.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "transport/shm/futex.h"
#include "transport/shm/shm_arena.h"
#include "transport/shm/shm_file.h"
#include "transport/shm/shm_ring.h"
#include "transport/shm/shm_transport.h"
#include "transport/wire.h"

namespace pushpull::transport {

inline constexpr uint64_t kSegmentMagic = 0x70707368'6d763034ull;  // "ppshmv04"
inline constexpr auto kSpinWindow = std::chrono::microseconds(50);
inline constexpr auto kSleepSlice =
    std::chrono::milliseconds(50);  // futex timeout: liveness checks
inline constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;

struct alignas(64) SegHeader {
  std::atomic<uint64_t> magic;  // set last by the creator (release)
  uint32_t size;
  uint32_t arena_slot_bytes;  // ShmOptions::arena_slot_bytes (at most 4 GiB - 1)
  uint64_t ring_bytes;
  std::atomic<uint32_t> doorbell;  // bumped by anyone with news for the owner
  std::atomic<uint32_t> closed;    // the owner closed
  std::atomic<int32_t> pid;        // the owner's process
  std::atomic<uint32_t> attached;  // peers that mapped this segment
  std::atomic<uint32_t> sleeping;  // the owner is (about to be) in FUTEX_WAIT
};
// One inbound ring per peer: the positions of transport/shm/shm_ring.h.
using RingCtl = transport::ShmRingCtl;
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(SegHeader) == 64 && sizeof(RingCtl) == 128);
// The segments' names (transport/shm/shm_file.h checks them): use_shared_memory's
// "pushpull-coll-" + 32 hex digits, or `<prefix>.<rank>`.
inline constexpr transport::ShmKind kSegmentKind{"pushpull-", 0};

inline size_t round64(size_t v) {
  return (v + 63) / 64 * 64;
}
// Header, one RingCtl and one ring per peer, then the arena (shm_arena.h):
// its ArenaCtl and two slots.
inline size_t arena_offset(int n, size_t ring) {
  return round64(sizeof(SegHeader) + static_cast<size_t>(n) * (sizeof(RingCtl) + ring));
}
inline size_t segment_bytes(int n, size_t ring, size_t slot) {
  return arena_offset(n, ring) + sizeof(ArenaCtl) + 2 * round64(slot);
}

// The system call only when the owner sleeps (or is about to): while it
// spins, a bump of the doorbell is all it needs. Either the owner's FUTEX_WAIT
// sees the bumped doorbell and returns at once, or this load sees `sleeping`
// (both sides sequentially consistent); the wait's timeout bounds the rest.
inline void ring_bell(SegHeader* h) {
  h->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (h->sleeping.load(std::memory_order_seq_cst)) futex_wake(&h->doorbell);
}

struct ShmTransport::Impl {
  struct Map {
    std::unique_ptr<transport::ShmFile> file;
    SegHeader* h = nullptr;
    RingCtl* ctl = nullptr;  // [size]
    char* data = nullptr;    // [size][ring]
    ArenaCtl* arena = nullptr;
    char* slots = nullptr;  // [2][slot]
  };
  struct SendOp {
    unsigned char hdr[16];
    const char* data;
    size_t bytes;
    size_t done = 0;  // of 16 + bytes
    Completion cb;
  };
  struct RecvOp {
    char* dst;
    size_t bytes;
    Completion cb;
  };
  // A message kept until its receive is posted; `claim` is a receive posted
  // while it was still arriving.
  struct Early {
    std::vector<char> buf;
    bool complete = false;
    std::optional<RecvOp> claim;
  };
  // The message being read from one peer (progress thread only).
  struct Incoming {
    unsigned char hdr[16];
    size_t hdr_got = 0;
    uint64_t tag = 0, bytes = 0, got = 0;
    std::optional<RecvOp> target;  // matched receive (its bytes checked)
    std::shared_ptr<Early> early;  // or kept for later
    Status error;                  // or discarded (size mismatch)
  };
  using Key = std::pair<int, uint64_t>;
  using Done = std::vector<std::pair<Completion, Status>>;

  int rank, size;
  ShmOptions o;
  std::string dir, prefix;
  std::vector<Map> maps;

  std::mutex send_mu;  // the send queues and writing into the peers' rings
  std::vector<std::deque<SendOp>> sendq;

  std::mutex mu;  // receives, early messages, peer and own state
  std::map<Key, std::deque<RecvOp>> posted;
  std::map<Key, std::deque<std::shared_ptr<Early>>> early;
  std::vector<uint64_t> early_bytes;
  std::vector<std::optional<Status>> dead;  // per peer: why its operations fail
  std::optional<Status> closed;

  std::vector<Incoming> incoming;  // progress thread only
  std::vector<bool> failed;        // progress thread only: its operations failed
  std::atomic<bool> stop{false};
  std::thread progress;
  std::unique_ptr<ShmArena> arena;  // null without slots (ShmOptions::arena_slot_bytes = 0)
  std::mutex join_mu;               // joining the thread and telling the peers (close, declare)
  bool told = false;                // the closed flag is set
  bool closing = false;             // under send_mu: close() has started

  // ---- the segments (shm_transport_setup.cpp) --------------------------------
  Impl(int r, int n, std::string pre, ShmOptions opts, std::string d);
  ~Impl();
  // Points maps[r] into rank r's segment `file`.
  void use_file(int r, std::unique_ptr<transport::ShmFile> file);
  // Creates this rank's segment and waits for every peer's (constructor).
  void setup();
  void make_arena();
  // Why the arena's operations with peer p fail, or ok.
  Status arena_check(int p);
  // Maps rank p's segment once it exists, is complete, and is ours to trust.
  bool try_attach(int p, size_t len);
  // Why rank p's segment (of that layout) is not this rank's to share.
  std::string disagreement(int p, uint32_t their_size, uint64_t their_ring,
                           uint32_t their_slot) const;

  // How messages name rank r: its rank in the job.
  int name(int r) const { return o.rank_names.empty() ? r : o.rank_names[static_cast<size_t>(r)]; }
  std::string name_of(int r) const {
    return o.segment_names.empty() ? fmt::format("{}.{}", prefix, r) : o.segment_names[size_t(r)];
  }
  std::string path_of(int r) const { return fmt::format("{}/{}", dir, name_of(r)); }
  // Creates, sizes and maps this rank's segment and writes its header.
  void create_own(size_t len);
  // Runs one step of the setup; with ShmOptions::agree, every rank learns
  // whether it worked on every rank, and all fail together (see there).
  void step(const std::function<void()>& f);
  Map& map(int r) { return maps[static_cast<size_t>(r)]; }
  // The ring in `owner`'s segment that rank `from` writes.
  transport::ShmRing ring(int owner, int from) {
    return transport::ShmRing(
        reinterpret_cast<std::byte*>(map(owner).data + static_cast<size_t>(from) * o.ring_bytes),
        o.ring_bytes);
  }

  // ---- the progress thread (shm_transport_progress.cpp) ----------------------

  // Copies as much of peer p's queue into its ring as fits; true if any byte moved.
  bool write_some(int p, Done& done);
  // PeerFailure naming rank p and why it is gone.
  Status gone(int p, const std::string& why) const;
  // The header of peer p's next message is in: find where its payload goes.
  void match(int p, Incoming& in, Done& done);
  // A message and its receive disagree on the size.
  static Status mismatch(uint64_t got, uint64_t tag, uint64_t want);
  // Peer p's message is all in: completes its receive, or marks the early
  // copy complete (handing it to a receive that claimed it meanwhile).
  void message_done(int p, Incoming& in, Done& done);
  // Reads what peer p has written into this rank's ring; true if any byte moved.
  bool read_some(int p, Done& done);
  // False once peer p closed or its process is gone.
  bool peer_alive(int p);
  // Fails every operation with peer p with `why` (its ring fully read).
  void fail_peer(int p, const Status& why, Done& done);
  // Every slice: fails the peers that closed or died.
  void check_peers(Done& done);
  // Runs the gathered completions (no lock held).
  static void run(Done& done);
  // The progress thread.
  void loop();
  void wake_self() { ring_bell(map(rank).h); }

  // ---- posting and closing (shm_transport.cpp) --------------------------------

  // `peer_too`: also refuse when the peer is gone (a receive first looks for
  // what the peer sent before it went).
  bool check_post(int peer, Completion& cb, bool peer_too = true);
  void post_send(int peer, uint64_t tag, const void* data, size_t bytes, Completion cb);
  void post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion cb);
  void close(const Status& reason, bool tell = true);
};

}  // namespace pushpull::transport
