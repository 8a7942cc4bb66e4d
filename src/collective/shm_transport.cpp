// SPDX-License-Identifier: Apache-2.0
#include "collective/shm_transport.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "collective/futex.h"
#include "collective/shm_arena.h"

namespace pushpull::collective {
namespace {

constexpr uint64_t kMagic = 0x70707368'6d763034ull;  // "ppshmv04"
constexpr auto kSpinWindow = std::chrono::microseconds(50);
constexpr auto kSleepSlice = std::chrono::milliseconds(50);  // futex timeout: liveness checks
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;

struct alignas(64) SegHeader {
  std::atomic<uint64_t> magic;  // set last by the creator (release)
  uint32_t size;
  uint32_t reserved;
  uint64_t ring_bytes;
  std::atomic<uint32_t> doorbell;  // bumped by anyone with news for the owner
  std::atomic<uint32_t> closed;    // the owner closed
  std::atomic<int32_t> pid;        // the owner's process
  std::atomic<uint32_t> attached;  // peers that mapped this segment
  std::atomic<uint32_t> sleeping;  // the owner is (about to be) in FUTEX_WAIT
};
struct alignas(64) RingCtl {
  std::atomic<uint64_t> head;  // bytes ever written (producer)
  char pad[56];
  std::atomic<uint64_t> tail;  // bytes ever read (consumer)
  char pad2[56];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
              std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(SegHeader) == 64 && sizeof(RingCtl) == 128);

size_t round64(size_t v) {
  return (v + 63) / 64 * 64;
}
// Header, one RingCtl and one ring per peer, then the arena (shm_arena.h):
// its ArenaCtl and two slots.
size_t arena_offset(int n, size_t ring) {
  return round64(sizeof(SegHeader) + static_cast<size_t>(n) * (sizeof(RingCtl) + ring));
}
size_t segment_bytes(int n, size_t ring, size_t slot) {
  return arena_offset(n, ring) + sizeof(ArenaCtl) + 2 * round64(slot);
}

// The system call only when the owner sleeps (or is about to): while it
// spins, a bump of the doorbell is all it needs. Either the owner's FUTEX_WAIT
// sees the bumped doorbell and returns at once, or this load sees `sleeping`
// (both sides sequentially consistent); the wait's timeout bounds the rest.
void ring_bell(SegHeader* h) {
  h->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (h->sleeping.load(std::memory_order_seq_cst)) futex_wake(&h->doorbell);
}

void put64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t get64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

struct ShmTransport::Impl {
  struct Map {
    void* base = MAP_FAILED;
    size_t len = 0;
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
  std::string dir, prefix, own_path;
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

  Impl(int r, int n, std::string pre, ShmOptions opts, std::string d)
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

  ~Impl() {
    for (auto& m : maps)
      if (m.base != MAP_FAILED) ::munmap(m.base, m.len);
    if (!own_path.empty()) ::unlink(own_path.c_str());
  }

  // How messages name rank r: its rank in the job.
  int name(int r) const { return o.rank_names.empty() ? r : o.rank_names[static_cast<size_t>(r)]; }
  std::string path_of(int r) const { return fmt::format("{}/{}.{}", dir, prefix, r); }
  Map& map(int r) { return maps[static_cast<size_t>(r)]; }
  char* ring_data(int owner, int from) {
    return map(owner).data + static_cast<size_t>(from) * o.ring_bytes;
  }

  void map_fd(int fd, int r, size_t len) {
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

  void setup() {
    const size_t len = segment_bytes(size, o.ring_bytes, o.arena_slot_bytes);
    own_path = path_of(rank);
    int fd = ::open(own_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      std::string why = std::strerror(errno);
      own_path.clear();  // not ours: never unlink it
      throw IoError(fmt::format("collective shm: cannot create {}: {}", path_of(rank), why));
    }
    // Reserves the pages now (posix_fallocate): a full /dev/shm is a clean
    // IoError here, not a SIGBUS on the first write into the segment.
    if (int e = ::posix_fallocate(fd, 0, static_cast<off_t>(len)); e != 0) {
      std::string why = std::strerror(e);
      ::close(fd);
      throw IoError(
          fmt::format("collective shm: cannot size {} to {} bytes: {}", own_path, len, why));
    }
    try {
      map_fd(fd, rank, len);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    SegHeader* h = map(rank).h;
    h->size = static_cast<uint32_t>(size);
    h->ring_bytes = o.ring_bytes;
    h->pid.store(static_cast<int32_t>(::getpid()));
    h->magic.store(kMagic, std::memory_order_release);

    const auto deadline = Clock::now() + o.connect_timeout;
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
    while (h->attached.load(std::memory_order_acquire) < static_cast<uint32_t>(size - 1)) {
      if (Clock::now() > deadline)
        throw Timeout(fmt::format("collective shm: not every peer mapped {} within {} ms", own_path,
                                  o.connect_timeout.count()));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ::unlink(own_path.c_str());  // every peer has it mapped; nothing to leak from here on
    own_path.clear();
    if (o.arena_slot_bytes > 0) make_arena();
  }

  void make_arena() {
    std::vector<ShmArena::Rank> ranks;
    for (int p = 0; p < size; ++p)
      ranks.push_back({map(p).arena, map(p).slots});
    arena = std::make_unique<ShmArena>(
        rank, std::move(ranks), o.arena_slot_bytes, o.arena_chunk_bytes,
        [this](int p) { return arena_check(p); }, [this](int r) { return name(r); });
  }

  // Why the arena's operations with peer p fail, or ok.
  Status arena_check(int p) {
    {
      std::lock_guard lock(mu);
      if (closed) return *closed;
      if (p == rank) return Status::ok();
      if (dead[static_cast<size_t>(p)]) return *dead[static_cast<size_t>(p)];
    }
    if (!peer_alive(p)) return gone(p, map(p).h->closed.load() ? "closed" : "its process exited");
    return Status::ok();
  }

  // Maps rank p's segment once it exists, is complete, and is ours to trust.
  bool try_attach(int p, size_t len) {
    int fd = ::open(path_of(p).c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      if (errno == ENOENT) return false;
      throw IoError(
          fmt::format("collective shm: cannot open {}: {}", path_of(p), std::strerror(errno)));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
      ::close(fd);
      throw IoError(fmt::format(
          "collective shm: {} is not a private segment of this user; refusing it", path_of(p)));
    }
    if (static_cast<size_t>(st.st_size) < len) {  // still being sized
      ::close(fd);
      return false;
    }
    if (static_cast<size_t>(st.st_size) != len) {
      ::close(fd);
      throw InvalidArgument(fmt::format(
          "collective shm: {} has {} bytes, expected {}; ranks disagree on size or ring bytes",
          path_of(p), st.st_size, len));
    }
    try {
      map_fd(fd, p, len);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    Map& m = map(p);
    if (m.h->magic.load(std::memory_order_acquire) != kMagic) {  // header not written yet
      ::munmap(m.base, m.len);
      m = Map{};
      return false;
    }
    if (m.h->size != static_cast<uint32_t>(size) || m.h->ring_bytes != o.ring_bytes)
      throw InvalidArgument(
          fmt::format("collective shm: rank {} has size {} ring {}, this rank {} {}", name(p),
                      m.h->size, m.h->ring_bytes, size, o.ring_bytes));
    m.h->attached.fetch_add(1, std::memory_order_acq_rel);
    return true;
  }

  // ---- sending (send_mu held) ------------------------------------------------

  // Copies as much of peer p's queue into its ring as fits; true if any byte moved.
  bool write_some(int p, Done& done) {
    auto& q = sendq[static_cast<size_t>(p)];
    if (q.empty()) return false;
    Map& m = map(p);
    RingCtl& c = m.ctl[rank];
    char* ring = ring_data(p, rank);
    uint64_t head = c.head.load(std::memory_order_relaxed);
    const uint64_t tail = c.tail.load(std::memory_order_acquire);
    uint64_t space = o.ring_bytes - (head - tail);
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
        size_t at = static_cast<size_t>(head % o.ring_bytes);
        n = std::min({n, static_cast<size_t>(space), o.ring_bytes - at});
        std::memcpy(ring + at, src, n);
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

  // ---- receiving (progress thread) -------------------------------------------

  Status gone(int p, const std::string& why) const {
    return Status(ErrorCode::kPeerFailure,
                  fmt::format("collective: rank {} is gone ({})", name(p), why));
  }

  // The header of peer p's next message is in: find where its payload goes.
  void match(int p, Incoming& in, Done& done) {
    in.tag = get64(in.hdr);
    in.bytes = get64(in.hdr + 8);
    in.got = 0;
    if (in.bytes > kMaxMessageBytes)
      throw ProtocolError(fmt::format("collective shm: rank {} announced a message of {} bytes",
                                      name(p), in.bytes));
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

  static Status mismatch(uint64_t got, uint64_t tag, uint64_t want) {
    return Status(ErrorCode::kProtocolError,
                  fmt::format("collective: message of {} bytes (tag {:#x}) for a receive of {} "
                              "bytes; the ranks disagree about the operation",
                              got, tag, want));
  }

  void message_done(int p, Incoming& in, Done& done) {
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

  // Reads what peer p has written into this rank's ring; true if any byte moved.
  bool read_some(int p, Done& done) {
    Map& own = map(rank);
    RingCtl& c = own.ctl[p];
    const char* ring = ring_data(rank, p);
    const uint64_t head = c.head.load(std::memory_order_acquire);
    uint64_t tail = c.tail.load(std::memory_order_relaxed);
    if (head == tail) return false;
    if (head - tail > o.ring_bytes)
      throw ProtocolError(fmt::format("collective shm: rank {}'s ring is corrupt", name(p)));
    Incoming& in = incoming[static_cast<size_t>(p)];
    auto copy_out = [&](char* dst, size_t n) {  // n bytes from the ring at tail
      while (n > 0) {
        size_t at = static_cast<size_t>(tail % o.ring_bytes);
        size_t k = std::min(n, o.ring_bytes - at);
        if (dst) {
          std::memcpy(dst, ring + at, k);
          dst += k;
        }
        tail += k;
        n -= k;
      }
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

  // ---- peers that closed or died -----------------------------------------------

  bool peer_alive(int p) {
    SegHeader* h = map(p).h;
    if (h->closed.load(std::memory_order_acquire)) return false;
    int32_t pid = h->pid.load();
    return !(pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH);
  }

  // Fails every operation with peer p with `why` (its ring fully read).
  void fail_peer(int p, const Status& why, Done& done) {
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

  void check_peers(Done& done) {
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

  static void run(Done& done) {
    for (auto& [cb, st] : done)
      cb(st);
    done.clear();
  }

  void loop() {
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

  void wake_self() { ring_bell(map(rank).h); }

  // ---- posting -------------------------------------------------------------------

  // `peer_too`: also refuse when the peer is gone (a receive first looks for
  // what the peer sent before it went).
  bool check_post(int peer, Completion& cb, bool peer_too = true) {
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

  void post_send(int peer, uint64_t tag, const void* data, size_t bytes, Completion cb) {
    if (!check_post(peer, cb)) return;
    SendOp op;
    put64(op.hdr, tag);
    put64(op.hdr + 8, bytes);
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

  void post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion cb) {
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

  void close(const Status& reason, bool tell = true) {
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
};

ShmTransport::ShmTransport(int rank, int size, const std::string& prefix, ShmOptions options,
                           const std::string& dir) {
  if (size < 1 || rank < 0 || rank >= size)
    throw InvalidArgument(fmt::format("ShmTransport: rank {} of size {}", rank, size));
  if (prefix.empty() || prefix.find('/') != std::string::npos)
    throw InvalidArgument(fmt::format("ShmTransport: bad segment prefix '{}'", prefix));
  if (!options.rank_names.empty() && options.rank_names.size() != static_cast<size_t>(size))
    throw InvalidArgument(
        fmt::format("ShmTransport: {} rank names for size {}", options.rank_names.size(), size));
  if (options.ring_bytes < 4096)
    throw InvalidArgument("ShmTransport: ring_bytes must be at least 4096");
  impl_ = std::make_unique<Impl>(rank, size, prefix, options, dir);
  impl_->setup();
  impl_->progress = std::thread([this] { impl_->loop(); });
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

}  // namespace pushpull::collective
