// SPDX-License-Identifier: Apache-2.0
#include "collective/shm_transport_impl.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <exception>

#include "net/socket.h"

namespace pushpull::collective {
namespace {

// A field of a segment header read as bytes (before the segment is mapped).
template <class T>
T load_at(const unsigned char* raw, size_t offset) {
  T v;
  std::memcpy(&v, raw + offset, sizeof v);
  return v;
}

}  // namespace

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

ShmTransport::Impl::~Impl() {
  for (auto& m : maps)
    if (m.base != MAP_FAILED) ::munmap(m.base, m.len);
  if (!own_path.empty()) ::unlink(own_path.c_str());
}

void ShmTransport::Impl::map_fd(int fd, int r, size_t len) {
  void* base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED)
    throw IoError(fmt::format("collective shm: mmap of rank {}'s segment: {}", name(r),
                              std::strerror(errno)));
  Map& m = map(r);
  m.base = base;
  m.len = len;
  m.h = static_cast<SegHeader*>(base);
  m.ctl = reinterpret_cast<RingCtl*>(static_cast<char*>(base) + sizeof(SegHeader));
  m.data =
      static_cast<char*>(base) + sizeof(SegHeader) + static_cast<size_t>(size) * sizeof(RingCtl);
  m.arena =
      reinterpret_cast<ArenaCtl*>(static_cast<char*>(base) + arena_offset(size, o.ring_bytes));
  m.slots = reinterpret_cast<char*>(m.arena) + sizeof(ArenaCtl);
}

void ShmTransport::Impl::create_own(size_t len) {
  own_path = path_of(rank);
  net::Fd fd(::open(own_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) {
    std::string why = std::strerror(errno);
    own_path.clear();  // not ours: never unlink it
    throw IoError(fmt::format("collective shm: cannot create {}: {}", path_of(rank), why));
  }
  // Reserves the pages now (posix_fallocate): a full /dev/shm is a clean
  // IoError here, not a SIGBUS on the first write into the segment.
  if (int e = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(len)); e != 0) {
    std::string why = std::strerror(e);
    throw IoError(
        fmt::format("collective shm: cannot size {} to {} bytes: {}", own_path, len, why));
  }
  map_fd(fd.get(), rank, len);
  fd.reset();  // the mapping outlives the descriptor
  SegHeader* h = map(rank).h;
  h->size = static_cast<uint32_t>(size);
  h->ring_bytes = o.ring_bytes;
  h->arena_slot_bytes = static_cast<uint32_t>(o.arena_slot_bytes);
  h->pid.store(static_cast<int32_t>(::getpid()));
  h->magic.store(kMagic, std::memory_order_release);
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
      throw Timeout(fmt::format("collective shm: not every peer mapped {} within {} ms", own_path,
                                o.connect_timeout.count()));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::unlink(own_path.c_str());  // every peer has it mapped; nothing to leak from here on
  own_path.clear();
  o.agree = nullptr;  // its captures live only as long as the constructor
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
  net::Fd fd(::open(path_of(p).c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) {
    if (errno == ENOENT) return false;
    throw IoError(
        fmt::format("collective shm: cannot open {}: {}", path_of(p), std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    throw IoError(fmt::format(
        "collective shm: {} is not a private segment of this user; refusing it", path_of(p)));
  }
  if (static_cast<size_t>(st.st_size) != len) {
    // posix_fallocate sizes a segment in one call and its header is written
    // after: a segment of another size is still being set up, or (its header
    // written) laid out for another job shape or arena.
    unsigned char raw[sizeof(SegHeader)];
    const bool written =
        static_cast<size_t>(st.st_size) >= sizeof raw &&
        ::pread(fd.get(), raw, sizeof raw, 0) == static_cast<ssize_t>(sizeof raw) &&
        load_at<uint64_t>(raw, offsetof(SegHeader, magic)) == kMagic;
    if (!written) return false;
    throw InvalidArgument(
        disagreement(p, load_at<uint32_t>(raw, offsetof(SegHeader, size)),
                     load_at<uint64_t>(raw, offsetof(SegHeader, ring_bytes)),
                     load_at<uint32_t>(raw, offsetof(SegHeader, arena_slot_bytes))));
  }
  map_fd(fd.get(), p, len);
  Map& m = map(p);
  if (m.h->magic.load(std::memory_order_acquire) != kMagic) {  // header not written yet
    ::munmap(m.base, m.len);
    m = Map{};
    return false;
  }
  if (m.h->size != static_cast<uint32_t>(size) || m.h->ring_bytes != o.ring_bytes ||
      m.h->arena_slot_bytes != o.arena_slot_bytes)
    throw InvalidArgument(disagreement(p, m.h->size, m.h->ring_bytes, m.h->arena_slot_bytes));
  m.h->attached.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

}  // namespace pushpull::collective
