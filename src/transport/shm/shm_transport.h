// SPDX-License-Identifier: Apache-2.0
// The collective Transport between ranks of one host, over shared memory.
//
// Every rank creates one segment (a file under /dev/shm, mode 0600, created
// O_EXCL | O_NOFOLLOW, its pages reserved up front, named `<prefix>.<rank>`
// or ShmOptions::segment_names; a peer's is mapped only when it is a regular
// file of this user that nobody else may open) holding a header and one
// inbound ring per peer; every rank maps every segment. Rank i sends to rank j by copying {tag u64,
// bytes u64, little-endian} and the payload into ring i of j's segment (single producer, single
// consumer, head/tail atomics), so a message is one copy in and one copy out, no system call on the
// data path. Once every peer has mapped a segment its creator unlinks the name, so nothing is left
// behind when a process dies later.
//
// One progress thread per rank writes queued sends into the peers' rings and
// reads its own rings into the posted receives (FIFO per (peer, tag); a
// message that arrives before its receive is posted is kept until it is,
// bounded by kMaxEarlyBytes). Posting a send whose peer has nothing queued
// copies it into the ring at once from the poster's thread (small messages
// then skip a thread hand-off). Wake-ups: each segment has a doorbell word; a
// writer bumps the reader's doorbell and FUTEX_WAKEs it (only when the
// reader has said it sleeps: no system call while it spins), a reader that
// freed space bumps the writer's. The progress thread re-checks for a short
// bounded window (kSpinWindow, yielding) before it sleeps in FUTEX_WAIT, with
// a timeout so it also notices peers that died without a word (their pid is
// in their header) or closed (a flag in their header).
//
// Semantics are Transport's (transport.h): completions run on the progress
// thread or the poster's, never under a lock; close() fails everything
// pending, tells the peers (closed flag), joins the thread. A peer that
// closed or died fails the operations with it with PeerFailure, after the
// messages it completed before are delivered. A malformed header from a peer
// (impossible sizes) is a ProtocolError that fails that peer's operations.
//
// Thread safety: every method may be called from any thread concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pushpull/options.h"
#include "transport/shm/shm_arena.h"
#include "transport/transport.h"

namespace pushpull::transport {

// What the rings of one host may take in all: there is one per ordered
// pair of ranks, reserved up front (posix_fallocate), so a fixed size grows
// with the square of the host's ranks (2 MiB rings: 4.5 GiB at 48 ranks,
// 130 GiB at 256, which the kernel's OOM killer ends).
inline constexpr uint64_t kShmHostRingBudget = uint64_t{2} << 30;
inline constexpr size_t kShmMinDataRingBytes = size_t{16} << 10;

// The ring size for `ranks` sharing a host: `max_ring` while the host's
// ranks * (ranks - 1) rings fit kShmHostRingBudget (up to 32 ranks with 2
// MiB), else the budget's share in whole pages, never below
// kShmMinDataRingBytes (a ring only bounds how much of a message is in flight;
// the ranks move data through it piece by piece). Every rank of the host
// computes the same size.
size_t ring_bytes_for_ranks(size_t max_ring, size_t ranks);

struct ShmOptions {
  // Payload bytes of each ring (one per ordered pair of ranks; see
  // ring_bytes_for_ranks).
  size_t ring_bytes = size_t{2} << 20;
  // How long the constructor waits for every peer's segment.
  Millis connect_timeout{10000};
  // How error messages name rank i of this transport (its rank in the
  // job, when the transport serves a subset of the job's ranks); empty: i.
  std::vector<int> rank_names;
  // Messages kept per peer before their receive is posted (bytes).
  uint64_t max_early_bytes = uint64_t{1} << 30;
  // Each of the arena's two slots (shm_arena.h): every allreduce goes
  // through them, a larger one in slot-sized segments; 0: no arena
  // (host_collectives() is null).
  size_t arena_slot_bytes = 1 << 20;
  // A slot allreduce moves and reduces this many bytes per step (shm_arena.h).
  // With 2 ranks, 1 MiB: 62-73 us in 128 KiB steps; 64 and 256 KiB no better
  // (interleaved runs, docs/performance.md).
  size_t arena_chunk_bytes = 128 << 10;
  // How the arena writes its slots (shm_arena.h): measured per host (auto),
  // or fixed.
  SlotStores arena_stores = SlotStores::kAuto;
  // Each rank's segment file name under the directory (one per rank, no
  // '/'); empty: `<prefix>.<rank>`. use_shared_memory gives every rank a
  // name with its own random 128 bits, so a name seen in /dev/shm tells
  // nobody the others' (a predictable name can be created first by another
  // local user: a squat).
  std::vector<std::string> segment_names;
  // When set, every rank calls it twice during the setup, collectively:
  // after creating its own segment and after mapping every peer's, with
  // whether that step worked; it returns every rank's answer (size()
  // entries). A step that failed anywhere then fails the constructor on
  // every rank at once (IoError naming the rank, or the rank's own error)
  // instead of leaving the others waiting for a segment until
  // connect_timeout, so the caller can fall back together. Unset: each rank
  // on its own, waiting up to connect_timeout for the peers' segments.
  std::function<std::vector<uint8_t>(bool ok)> agree;
};

class ShmTransport final : public Transport {
 public:
  // Creates this rank's segment `<dir>/<prefix>.<rank>` and maps every
  // peer's (waiting up to connect_timeout for them to appear and for every
  // peer to map this one). `prefix` must be the same on every rank and
  // unique to the job (it carries a random token). Throws IoError / Timeout.
  ShmTransport(int rank, int size, const std::string& prefix, ShmOptions options = {},
               const std::string& dir = "/dev/shm");
  ~ShmTransport() override;
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  int rank() const override;
  int size() const override;
  void post_send(int peer, uint64_t tag, const void* data, size_t bytes, Completion done) override;
  void post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) override;
  void close(const Status& reason) override;
  // The arena's allreduce and barrier (shm_arena.h), or null without one.
  HostCollectives* host_collectives() override;
  // Fails every pending and later operation with `verdict` (an outside
  // failure detector's, see ShmDataTransport) without telling the peers
  // through the segment: they learn it from that detector too, and must not
  // blame this rank for closing. close() still follows.
  void declare(const Status& verdict);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pushpull::transport
