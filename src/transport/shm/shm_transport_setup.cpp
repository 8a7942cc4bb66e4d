// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/shm_transport_impl.h"

#include <unistd.h>

#include <cstdint>
#include <exception>

namespace pushpull::transport {
ShmTransport::Impl::Impl(int r, int n, std::string pre, ShmOptions opts, std::string d)
    : rank(r),
      size(n),
      o(opts),
      dir(std::move(d)),
      prefix(std::move(pre)),
      maps(static_cast<size_t>(n)),
      sendq(static_cast<size_t>(n)),
      early_bytes(static_cast<size_t>(n), 0),
      dead(static_cast<size_t>(n)),
      incoming(static_cast<size_t>(n)),
      failed(static_cast<size_t>(n), false) {}

ShmTransport::Impl::~Impl() = default;  // the files unmap (and unlink) themselves

void ShmTransport::Impl::use_file(int r, std::unique_ptr<transport::ShmFile> file) {
  Map& m = map(r);
  char* base = reinterpret_cast<char*>(file->data());
  m.file = std::move(file);
  m.h = reinterpret_cast<SegHeader*>(base);
  m.ctl = reinterpret_cast<RingCtl*>(base + sizeof(SegHeader));
  m.data = base + sizeof(SegHeader) + static_cast<size_t>(size) * sizeof(RingCtl);
  m.arena = reinterpret_cast<ArenaCtl*>(base + arena_offset(size, o.ring_bytes));
  m.slots = reinterpret_cast<char*>(m.arena) + sizeof(ArenaCtl);
}

void ShmTransport::Impl::create_own(size_t len) {
  std::unique_ptr<transport::ShmFile> file;
  if (Status st = transport::ShmFile::create_named(dir, name_of(rank), kSegmentKind, len,
                                                   transport::ShmMapping{.writable = true}, &file);
      !st)
    throw IoError("collective shm: " + st.message());
  use_file(rank, std::move(file));
  SegHeader* h = map(rank).h;
  h->size = static_cast<uint32_t>(size);
  h->ring_bytes = o.ring_bytes;
  h->arena_slot_bytes = static_cast<uint32_t>(o.arena_slot_bytes);
  h->pid.store(static_cast<int32_t>(::getpid()));
  h->magic.store(kSegmentMagic, std::memory_order_release);
}

void ShmTransport::Impl::step(const std::function<void()>& f) {
  if (!o.agree) return f();
  // Every rank must reach the agreement, whatever its own step did.
  std::exception_ptr mine;
  try {
    f();
  } catch (const Error&) {
    mine = std::current_exception();
  }
  const std::vector<uint8_t> all = o.agree(mine == nullptr);
  if (mine) std::rethrow_exception(mine);
  for (int p = 0; p < size; ++p)
    if (static_cast<size_t>(p) >= all.size() || all[static_cast<size_t>(p)] == 0)
      throw IoError(
          fmt::format("collective shm: rank {} could not set up its shared memory", name(p)));
}

void ShmTransport::Impl::setup() {
  const size_t len = segment_bytes(size, o.ring_bytes, o.arena_slot_bytes);
  step([&] { create_own(len); });
  SegHeader* h = map(rank).h;

  const auto deadline = Clock::now() + o.connect_timeout;
  step([&] {
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      for (;;) {
        if (try_attach(p, len)) break;
        if (Clock::now() > deadline)
          throw Timeout(
              fmt::format("collective shm: rank {}'s segment {} did not appear within {} ms",
                          name(p), path_of(p), o.connect_timeout.count()));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  });
  while (h->attached.load(std::memory_order_acquire) < static_cast<uint32_t>(size - 1)) {
    if (Clock::now() > deadline)
      throw Timeout(fmt::format("collective shm: not every peer mapped {} within {} ms",
                                path_of(rank), o.connect_timeout.count()));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  map(rank).file->unlink();  // every peer has it mapped; nothing to leak from here on
  o.agree = nullptr;         // its captures live only as long as the constructor
  if (o.arena_slot_bytes > 0) make_arena();
}

void ShmTransport::Impl::make_arena() {
  std::vector<ShmArena::Rank> ranks;
  for (int p = 0; p < size; ++p)
    ranks.push_back({map(p).arena, map(p).slots});
  arena = std::make_unique<ShmArena>(
      rank, std::move(ranks), o.arena_slot_bytes, o.arena_chunk_bytes,
      [this](int p) { return arena_check(p); }, [this](int r) { return name(r); }, o.arena_stores);
}

Status ShmTransport::Impl::arena_check(int p) {
  {
    std::lock_guard lock(mu);
    if (closed) return *closed;
    if (p == rank) return Status::ok();
    if (dead[static_cast<size_t>(p)]) return *dead[static_cast<size_t>(p)];
  }
  if (!peer_alive(p)) return gone(p, map(p).h->closed.load() ? "closed" : "its process exited");
  return Status::ok();
}

std::string ShmTransport::Impl::disagreement(int p, uint32_t their_size, uint64_t their_ring,
                                             uint32_t their_slot) const {
  auto layout = [](uint64_t n, uint64_t ring, uint64_t slot) {
    return fmt::format("{} ranks, {}-byte rings and {}-byte arena slots", n, ring, slot);
  };
  return fmt::format(
      "collective shm: rank {}'s segment {} is laid out for {}, this rank's for {}; every rank of "
      "a host needs the same PUSHPULL_SHM_ARENA_SLOT_BYTES",
      name(p), path_of(p), layout(their_size, their_ring, their_slot),
      layout(static_cast<uint64_t>(size), o.ring_bytes, o.arena_slot_bytes));
}

bool ShmTransport::Impl::try_attach(int p, size_t len) {
  std::unique_ptr<transport::ShmFile> file;
  const Status st =
      transport::ShmFile::open(dir, name_of(p), kSegmentKind, sizeof(SegHeader), UINT64_MAX,
                               transport::ShmMapping{.writable = true}, &file);
  // Not there yet, or not yet sized (posix_fallocate sizes it in one call).
  if (st.code() == ErrorCode::kNotFound || st.code() == ErrorCode::kProtocolError) return false;
  if (!st) throw IoError("collective shm: " + st.message());
  const auto* h = reinterpret_cast<const SegHeader*>(file->data());
  // The header is written after the file is sized: a segment of another
  // size without one is still being set up; with one, it is laid out for
  // another job shape or arena.
  if (h->magic.load(std::memory_order_acquire) != kSegmentMagic) return false;
  if (file->size() != len || h->size != static_cast<uint32_t>(size) ||
      h->ring_bytes != o.ring_bytes || h->arena_slot_bytes != o.arena_slot_bytes)
    throw InvalidArgument(disagreement(p, h->size, h->ring_bytes, h->arena_slot_bytes));
  use_file(p, std::move(file));
  map(p).h->attached.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

}  // namespace pushpull::transport
