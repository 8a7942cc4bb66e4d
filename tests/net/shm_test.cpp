// SPDX-License-Identifier: Apache-2.0
// The same-host shared-memory path of the MessageTransport (transport/shm/shm_setup.h):
// payloads of every size through small rings, in order with TCP-only
// messages, both directions at once; a peer that dies mid-payload; peers
// that lie in the setup or the frames; the opt-out.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>

#include <future>
#include <numeric>
#include <thread>

#include "base/metrics.h"
#include "fixture.h"
#include "pushpull/options.h"
#include "support/wait.h"
#include "transport/host_identity.h"
#include "transport/shm/shm_segment.h"
#include "transport/shm/shm_setup.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::transport {
namespace {

using namespace std::chrono_literals;
using test::RawClient;
using test::Sink;
using test::wait_until;

using test::kData;
using test::kReply;

// A small ring, so big payloads wrap it many times and wait for releases.
TransportConfig shm_config(Role role, int rank, bool on = true) {
  TransportConfig c = test::config(role, rank);
  c.shared_memory = on;
  c.shm_ring_bytes = 64 << 10;
  return c;
}

int64_t shm_bytes() {
  return metrics::value(metrics::Counter::kNetShmBytes);
}
int64_t tcp_bytes() {
  return metrics::value(metrics::Counter::kNetTcpBytes);
}

std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 131 + seed * 7) & 0xff);
  return v;
}

// Segments left in `dir` (every one must be unlinked once set up).
size_t leftover_segments(const std::string& dir) {
  size_t n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (ShmSegment::valid_name(e->d_name)) ++n;
    closedir(d);
  }
  return n;
}

// A private directory on tmpfs, removed at the end.
struct TempShmDir {
  TempShmDir() {
    char t[] = "/dev/shm/pushpull-test-XXXXXX";
    EXPECT_NE(mkdtemp(t), nullptr);
    path = t;
  }
  ~TempShmDir() { ::rmdir(path.c_str()); }
  std::string path;
};

TEST(ShmTransport, PayloadsOfEverySizeArriveInOrderThroughTheRing) {
  TempShmDir dir;
  TransportConfig ca = shm_config(Role::kServer, 0), cb = shm_config(Role::kWorker, 1);
  ca.shm_dir = cb.shm_dir = dir.path;
  Sink a(ca);
  MessageTransport b(cb);
  b.start();
  ConnId c = b.connect("127.0.0.1", a.t.port());
  const int64_t shm0 = shm_bytes(), tcp0 = tcp_bytes();
  // Large and small, zero-length and copied, in one order.
  const std::vector<size_t> sizes{1, 0, 100, 64 << 10, (1 << 20) + 3, 7, 5 << 20, 0, 4096, 65537};
  std::vector<std::vector<std::byte>> sent;
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sent.push_back(pattern(sizes[i], static_cast<uint32_t>(i)));
    total += sizes[i];
  }
  std::atomic<int> done{0};
  for (size_t i = 0; i < sizes.size(); ++i) {
    Header h{.type = kData, .request_id = i};
    if (i % 3 == 2) {
      ASSERT_TRUE(b.send_copy(c, h, sent[i].data(), sent[i].size()).is_ok());
      ++done;
    } else {
      b.send(c, h, sent[i].data(), sent[i].size(), [&](const Status& s) {
        EXPECT_TRUE(s.is_ok()) << s.message();
        ++done;
      });
    }
  }
  ASSERT_TRUE(wait_until([&] { return a.count() == sizes.size(); }, 30s));
  ASSERT_TRUE(wait_until([&] { return done.load() == static_cast<int>(sizes.size()); }));
  {
    std::lock_guard l(a.mu);
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_EQ(a.got[i].header.request_id, i);
      ASSERT_EQ(a.got[i].payload.size(), sizes[i]);
      // (memcmp of zero bytes: an empty payload's data() may be null, which
      // memcmp must not be given even for size 0.)
      if (sizes[i] > 0) {
        EXPECT_EQ(0, std::memcmp(a.got[i].payload.data(), sent[i].data(), sizes[i])) << i;
      }
    }
  }
  // Every payload byte went through the ring, none over TCP.
  EXPECT_EQ(shm_bytes() - shm0, static_cast<int64_t>(total));
  EXPECT_EQ(tcp_bytes() - tcp0, 0);
  // Both names are gone from /dev/shm (unlinked once mapped).
  EXPECT_EQ(leftover_segments(dir.path), 0u);
}

TEST(ShmTransport, PostedReceiveAndBothDirectionsAtOnce) {
  Sink a(shm_config(Role::kServer, 0));
  MessageTransport b(shm_config(Role::kWorker, 1));
  b.set_handler(kData, kData, [](Message&&) {});
  b.start();
  ConnId c = b.connect("127.0.0.1", a.t.port());
  ASSERT_TRUE(wait_until([&] { return a.npeers() == 1; }));
  ConnId back = a.peers[0].first;
  // Each side sends 8 x 3 MiB to the other at once through 64 KiB rings:
  // both wait for releases that travel behind their own pieces.
  const size_t n = 3 << 20;
  const int k = 8;
  std::vector<std::vector<std::byte>> from_b, from_a;
  std::vector<std::vector<std::byte>> into_a(k, std::vector<std::byte>(n)),
      into_b(k, std::vector<std::byte>(n));
  std::atomic<int> arrived{0}, sent{0};
  for (int i = 0; i < k; ++i) {
    from_b.push_back(pattern(n, static_cast<uint32_t>(i)));
    from_a.push_back(pattern(n, static_cast<uint32_t>(100 + i)));
    auto got = [&](const Status& s, const Header& h) {
      EXPECT_TRUE(s.is_ok()) << s.message();
      EXPECT_EQ(h.payload_bytes, n);
      ++arrived;
    };
    const auto id = static_cast<uint64_t>(i);
    ASSERT_TRUE(a.t.post_recv(back, {kReply, id, 0}, into_a[i].data(), n, got).is_ok());
    ASSERT_TRUE(b.post_recv(c, {kReply, id, 0}, into_b[i].data(), n, got).is_ok());
  }
  auto on_sent = [&](const Status& s) {
    EXPECT_TRUE(s.is_ok()) << s.message();
    ++sent;
  };
  std::thread ta([&] {
    for (int i = 0; i < k; ++i)
      a.t.send(back, Header{.type = kReply, .request_id = static_cast<uint64_t>(i)},
               from_a[i].data(), n, on_sent);
  });
  for (int i = 0; i < k; ++i)
    b.send(c, Header{.type = kReply, .request_id = static_cast<uint64_t>(i)}, from_b[i].data(), n,
           on_sent);
  ta.join();
  ASSERT_TRUE(wait_until([&] { return arrived.load() == 2 * k && sent.load() == 2 * k; }, 60s));
  for (int i = 0; i < k; ++i) {
    EXPECT_EQ(into_a[i], from_b[i]) << i;
    EXPECT_EQ(into_b[i], from_a[i]) << i;
  }
  EXPECT_EQ(a.count(), 0u);
}

TEST(ShmTransport, OptOutOnEitherSideKeepsEverythingOnTcp) {
  for (bool server_on : {false, true}) {
    Sink a(shm_config(Role::kServer, 0, server_on));
    MessageTransport b(shm_config(Role::kWorker, 1, !server_on));
    b.start();
    ConnId c = b.connect("127.0.0.1", a.t.port());
    const int64_t shm0 = shm_bytes(), tcp0 = tcp_bytes();
    auto big = pattern(1 << 20, 3);
    ASSERT_TRUE(b.send_copy(c, Header{.type = kData}, big.data(), big.size()).is_ok());
    ASSERT_TRUE(wait_until([&] { return a.count() == 1; }));
    std::lock_guard l(a.mu);
    ASSERT_EQ(a.got[0].payload.size(), big.size());
    EXPECT_EQ(0, std::memcmp(a.got[0].payload.data(), big.data(), big.size()));
    EXPECT_EQ(shm_bytes() - shm0, 0);
    EXPECT_EQ(tcp_bytes() - tcp0, static_cast<int64_t>(big.size()));
  }
  // PUSHPULL_PS_SHM=0 is the switch of the cluster's nodes.
  Environment env;
  EXPECT_TRUE(Options::from_env(env).net.ps_shared_memory);
  env.set("PUSHPULL_PS_SHM", "0");
  EXPECT_FALSE(Options::from_env(env).net.ps_shared_memory);
}

// A hand-driven connector that sets the shared memory up itself.
struct RawShmPeer {
  explicit RawShmPeer(int port, int rank = 7) : raw(port) { raw.hello("", Role::kWorker, rank); }
  // Offers `record`; returns the acceptor's answer.
  ShmAnswer offer(const HostRecord& record) {
    auto p = encode(record);
    raw.write(Header{.type = msg::kShmOffer, .payload_bytes = p.size()}, p);
    ShmAnswer answer;
    EXPECT_TRUE(decode(raw.read_message(msg::kShmAnswer), &answer).is_ok());
    return answer;
  }
  // The whole setup, honestly.
  void setup() {
    Status st = ShmSegment::create(64 << 10, "/dev/shm", &mine);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ShmAnswer a = offer(mine->record());
    ASSERT_TRUE(a.accepted) << a.reason;
    st = ShmSegment::open(a.ring, "/dev/shm", &theirs);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    raw.write(Header{.type = msg::kShmConfirm}, {});
  }
  void frame(uint16_t type, uint64_t offset, uint64_t length = 0) {
    raw.write(Header{.type = type, .offset = offset, .length = length}, {});
  }
  RawClient raw;
  std::unique_ptr<ShmSegment> mine, theirs;
};

TEST(ShmTransport, AnHonestHandDrivenPeerIsServed) {
  Sink a(shm_config(Role::kServer, 0));
  RawShmPeer p(a.t.port());
  ASSERT_NO_FATAL_FAILURE(p.setup());
  auto data = pattern(100000, 9);
  p.mine->write(0, data.data(), 60000);
  p.raw.write(Header{.type = kData, .net_flags = kNetFlagShmPayload, .payload_bytes = data.size()},
              {});
  p.frame(msg::kShmPiece, 0, 60000);
  ASSERT_TRUE(wait_until([&] { return a.count() == 0; }));
  p.mine->write(60000, data.data() + 60000, 40000);  // wraps the 64 KiB ring
  p.frame(msg::kShmPiece, 60000, 40000);
  ASSERT_TRUE(wait_until([&] { return a.count() == 1; }));
  std::lock_guard l(a.mu);
  ASSERT_EQ(a.got[0].payload.size(), data.size());
  EXPECT_EQ(0, std::memcmp(a.got[0].payload.data(), data.data(), data.size()));
  EXPECT_TRUE(a.closes.empty());
}

TEST(ShmTransport, APeerThatDiesMidPayloadClosesOnlyItsConnection) {
  Sink a(shm_config(Role::kServer, 0));
  RawShmPeer p(a.t.port());
  ASSERT_NO_FATAL_FAILURE(p.setup());
  ASSERT_TRUE(wait_until([&] { return a.npeers() == 1; }));
  ConnId back = a.peers[0].first;
  std::vector<std::byte> dst(1 << 20);
  std::promise<Status> failed;
  ASSERT_TRUE(a.t.post_recv(back, {kData, 1, 0}, dst.data(), dst.size(),
                            [&](const Status& s, const Header&) { failed.set_value(s); })
                  .is_ok());
  auto data = pattern(1 << 20, 1);
  p.mine->write(0, data.data(), 32 << 10);
  p.raw.write(Header{.type = kData,
                     .request_id = 1,
                     .net_flags = kNetFlagShmPayload,
                     .payload_bytes = data.size()},
              {});
  p.frame(msg::kShmPiece, 0, 32 << 10);
  p.raw.close();  // gone with most of the payload unsent
  auto f = failed.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_FALSE(f.get().is_ok());
  ASSERT_TRUE(wait_until([&] { return a.ncloses() == 1; }));
  EXPECT_EQ(a.count(), 0u);
  // The node goes on serving others.
  MessageTransport b(shm_config(Role::kWorker, 2));
  b.start();
  ConnId c = b.connect("127.0.0.1", a.t.port());
  ASSERT_TRUE(b.send_copy(c, Header{.type = kData}, data.data(), data.size()).is_ok());
  ASSERT_TRUE(wait_until([&] { return a.count() == 1; }));
}

TEST(ShmTransport, ASenderThatStopsMidPayloadFailsTheReceiveWithoutHanging) {
  Sink a(shm_config(Role::kServer, 0));
  auto b = std::make_unique<MessageTransport>(shm_config(Role::kWorker, 1));
  b->start();
  ConnId c = b->connect("127.0.0.1", a.t.port());
  ASSERT_TRUE(wait_until([&] { return a.npeers() == 1; }));
  ConnId back = a.peers[0].first;
  const size_t n = 64 << 20;
  std::vector<std::byte> src(n, std::byte{1}), dst(n);
  std::promise<Status> recv;
  ASSERT_TRUE(a.t.post_recv(back, {kData, 1, 0}, dst.data(), n,
                            [&](const Status& s, const Header&) { recv.set_value(s); })
                  .is_ok());
  std::promise<Status> sent;
  b->send(c, Header{.type = kData, .request_id = 1}, src.data(), n,
          [&](const Status& s) { sent.set_value(s); });
  b.reset();  // stops mid-payload (64 MiB through a 64 KiB ring takes a while)
  auto sf = sent.get_future();
  ASSERT_EQ(sf.wait_for(10s), std::future_status::ready);
  auto rf = recv.get_future();
  ASSERT_EQ(rf.wait_for(10s), std::future_status::ready);
  // Either it made it before the stop, or both sides failed cleanly.
  EXPECT_EQ(sf.get().is_ok(), rf.get().is_ok());
}

// Each of these lies closes the connection (and only it).
TEST(ShmTransport, PeersThatLieAreRefused) {
  Sink a(shm_config(Role::kServer, 0));
  auto expect_closed = [&](RawShmPeer& p, size_t closes) {
    EXPECT_TRUE(p.raw.closed_by_peer());
    EXPECT_TRUE(wait_until([&] { return a.ncloses() == closes; }));
  };
  {  // A confirmation with a payload.
    RawShmPeer p(a.t.port());
    std::unique_ptr<ShmSegment> mine;
    Status st = ShmSegment::create(64 << 10, "/dev/shm", &mine);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ShmAnswer ans = p.offer(mine->record());
    ASSERT_TRUE(ans.accepted) << ans.reason;
    const std::vector<std::byte> junk(32);
    p.raw.write(Header{.type = msg::kShmConfirm, .payload_bytes = junk.size()}, junk);
    expect_closed(p, 1);
  }
  {  // A shared-memory payload without the setup.
    RawShmPeer p(a.t.port());
    p.raw.write(Header{.type = kData, .net_flags = kNetFlagShmPayload, .payload_bytes = 10}, {});
    expect_closed(p, 2);
  }
  {  // A piece at a position that was never announced.
    RawShmPeer p(a.t.port());
    ASSERT_NO_FATAL_FAILURE(p.setup());
    p.raw.write(Header{.type = kData, .net_flags = kNetFlagShmPayload, .payload_bytes = 10}, {});
    p.frame(msg::kShmPiece, 4096, 10);
    expect_closed(p, 3);
  }
  {  // A piece longer than the payload.
    RawShmPeer p(a.t.port());
    ASSERT_NO_FATAL_FAILURE(p.setup());
    p.raw.write(Header{.type = kData, .net_flags = kNetFlagShmPayload, .payload_bytes = 10}, {});
    p.frame(msg::kShmPiece, 0, 11);
    expect_closed(p, 4);
  }
  {  // Another message inside a shared-memory payload.
    RawShmPeer p(a.t.port());
    ASSERT_NO_FATAL_FAILURE(p.setup());
    p.raw.write(Header{.type = kData, .net_flags = kNetFlagShmPayload, .payload_bytes = 10}, {});
    p.raw.write(Header{.type = kData}, {});
    expect_closed(p, 5);
  }
  {  // A release of bytes never written.
    RawShmPeer p(a.t.port());
    ASSERT_NO_FATAL_FAILURE(p.setup());
    p.frame(msg::kShmRelease, 1);
    expect_closed(p, 6);
  }
  {  // A second offer.
    RawShmPeer p(a.t.port());
    ASSERT_NO_FATAL_FAILURE(p.setup());
    auto offer = encode(p.mine->record());
    p.raw.write(Header{.type = msg::kShmOffer, .payload_bytes = offer.size()}, offer);
    expect_closed(p, 7);
  }
  EXPECT_EQ(a.count(), 0u);
}

// The offer is a host record, judged by transport::verify (transport/host_identity.h;
// its refusals one by one: tests/net/host_proof_test.cpp): every record it
// cannot prove is declined and the connection goes on over TCP.
TEST(ShmTransport, AnOfferIsJudgedByTheOneHostProof) {
  Sink a(shm_config(Role::kServer, 0));
  TempShmDir dir;
  std::vector<std::unique_ptr<ShmSegment>> segs(5);
  for (auto& s : segs) {
    Status st = ShmSegment::create(64 << 10, "/dev/shm", &s);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  std::vector<HostRecord> offers;
  for (auto& s : segs)
    offers.push_back(s->record());
  offers[1].key = "00000000-0000-0000-0000-000000000000|elsewhere|net 4:1|pid 4:2";
  offers[2].key = host_key(dir.path);    // another segment directory
  offers[3].content[0] ^= std::byte{1};  // forged: the file is there, the content is not
  offers[4].file[0] ^= std::byte{1};     // a file that is not there
  const std::vector<std::string> why = {"", "another host", "another host", "does not hold",
                                        "cannot open"};
  std::vector<std::unique_ptr<RawShmPeer>> peers;
  for (size_t i = 0; i < offers.size(); ++i) {
    peers.push_back(std::make_unique<RawShmPeer>(a.t.port(), 7 + static_cast<int>(i)));
    ShmAnswer ans = peers.back()->offer(offers[i]);
    EXPECT_EQ(ans.accepted, i == 0) << i << " " << ans.reason;
    EXPECT_NE(ans.reason.find(why[i]), std::string::npos) << i << " " << ans.reason;
  }
  const char text[] = "still here";
  for (size_t i = 1; i < peers.size(); ++i)
    peers[i]->raw.write(Header{.type = kData, .payload_bytes = sizeof text},
                        std::as_bytes(std::span(text, sizeof text)));
  ASSERT_TRUE(wait_until([&] { return a.count() == peers.size() - 1; }));
  EXPECT_EQ(a.ncloses(), 0u);
}

// A process killed between creating a segment and its peer's proof leaves
// the name behind; an hour later a create() on this host removes it. Only
// this user's regular files of pushpull's name form, old enough, go.
TEST(ShmSegment, NamesLeftByKilledProcessesAreSweptOnceStale) {
  TempShmDir dir;
  auto make = [&](const std::string& name, int age_s) {
    const std::string path = dir.path + "/" + name;
    Fd fd(::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
    EXPECT_TRUE(fd.valid()) << path;
    timespec t[2];
    t[0].tv_sec = t[1].tv_sec = ::time(nullptr) - age_s;
    t[0].tv_nsec = t[1].tv_nsec = 0;
    EXPECT_EQ(::futimens(fd.get(), t), 0);
    return path;
  };
  const std::string stale = make(std::string(kShmNamePrefix) + std::string(32, '1'), 7200);
  const std::string fresh = make(std::string(kShmNamePrefix) + std::string(32, '2'), 10);
  const std::string other = make("someone-elses-file", 7200);
  const std::string link = dir.path + "/" + std::string(kShmNamePrefix) + std::string(32, '3');
  ASSERT_EQ(::symlink(other.c_str(), link.c_str()), 0);
  EXPECT_EQ(ShmSegment::sweep_stale(dir.path, kShmStaleAfter), 1);
  EXPECT_NE(::access(stale.c_str(), F_OK), 0) << "the stale segment is still there";
  EXPECT_EQ(::access(fresh.c_str(), F_OK), 0) << "a segment still in its setup was removed";
  EXPECT_EQ(::access(other.c_str(), F_OK), 0);
  struct stat st {};
  EXPECT_EQ(::lstat(link.c_str(), &st), 0) << "a symlink was followed or removed";
  for (const std::string& p : {fresh, other, link})
    ::unlink(p.c_str());
}

// A name whose creator is gone (the pid in its header) goes after two
// minutes instead of an hour; one whose creator lives, or that is younger,
// stays.
TEST(ShmSegment, NamesWhoseCreatorDiedAreSweptAfterTwoMinutes) {
  TempShmDir dir;
  int names[2];
  ASSERT_EQ(::pipe(names), 0);
  // Two segments made by a child that then dies without removing them (as a
  // SIGKILL mid-setup leaves them).
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string both;
    for (int i = 0; i < 2; ++i) {
      std::unique_ptr<ShmSegment> s;
      if (!ShmSegment::create(kShmMinRingBytes, dir.path, &s)) ::_exit(2);
      both += s->name() + "\n";
      s.release();  // never unlinked: the process "dies" with the names
    }
    if (::write(names[1], both.data(), both.size()) != static_cast<ssize_t>(both.size()))
      ::_exit(3);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  char buf[256] = {};
  ASSERT_GT(::read(names[0], buf, sizeof buf - 1), 0);
  ::close(names[0]);
  ::close(names[1]);
  std::string text = buf;
  const std::string orphan = dir.path + "/" + text.substr(0, text.find('\n'));
  const std::string young =
      dir.path + "/" + text.substr(text.find('\n') + 1, sizeof(kShmNamePrefix) - 1 + 32);
  // And one of this (live) process.
  std::unique_ptr<ShmSegment> mine;
  Status st = ShmSegment::create(kShmMinRingBytes, dir.path, &mine);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const std::string live = dir.path + "/" + mine->name();
  auto age = [](const std::string& path, int seconds) {
    timespec t[2];
    t[0].tv_sec = t[1].tv_sec = ::time(nullptr) - seconds;
    t[0].tv_nsec = t[1].tv_nsec = 0;
    EXPECT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, 0), 0) << path;
  };
  // Names whose creator died before it wrote the header: one empty, one
  // truncated to size but all zeroes.
  const std::string empty = dir.path + "/" + kShmNamePrefix + std::string(32, 'e');
  const std::string zeroes = dir.path + "/" + kShmNamePrefix + std::string(32, '0');
  for (const std::string& path : {empty, zeroes}) {
    const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << path;
    if (path == zeroes) {
      EXPECT_EQ(::ftruncate(fd, 4096), 0);
    }
    ::close(fd);
  }
  age(orphan, 300);
  age(young, 30);
  age(live, 300);
  age(empty, 300);
  age(zeroes, 300);
  EXPECT_EQ(ShmSegment::sweep_stale(dir.path, kShmStaleAfter, kShmOrphanAfter), 3);
  EXPECT_NE(::access(empty.c_str(), F_OK), 0) << "a segment with no header is still there";
  EXPECT_NE(::access(zeroes.c_str(), F_OK), 0) << "a segment with a zero header is still there";
  EXPECT_NE(::access(orphan.c_str(), F_OK), 0) << "a dead creator's segment is still there";
  EXPECT_EQ(::access(young.c_str(), F_OK), 0) << "a segment younger than two minutes went";
  EXPECT_EQ(::access(live.c_str(), F_OK), 0) << "a live creator's segment went";
  ::unlink(young.c_str());
  mine.reset();  // unlinks its own name
}

TEST(ShmSegment, OnlyItsOwnNamesAndWellFormedSetupMessages) {
  EXPECT_TRUE(ShmSegment::valid_name(std::string(kShmNamePrefix) + std::string(32, '0')));
  for (const std::string& bad :
       std::vector<std::string>{"", "pushpull-net-", "../etc/passwd",
                                std::string(kShmNamePrefix) + std::string(31, '0') + "/",
                                std::string(kShmNamePrefix) + std::string(32, 'A'),
                                std::string(kShmNamePrefix) + std::string(33, '0')})
    EXPECT_FALSE(ShmSegment::valid_name(bad)) << bad;
  std::unique_ptr<ShmSegment> seg;
  EXPECT_EQ(ShmSegment::create(1000, "/dev/shm", &seg).code(),  // not a multiple of 4 KiB
            ErrorCode::kInvalidArgument);
  Status st = ShmSegment::create(64 << 10, "/nonexistent-dir", &seg);
  EXPECT_EQ(st.code(), ErrorCode::kIoError);
  EXPECT_NE(st.message().find("/nonexistent-dir"), std::string::npos) << st.message();
  EXPECT_FALSE(seg);

  ShmAnswer a{true, "", HostRecord{.key = host_key("/dev/shm")}};
  a.ring.file[3] = std::byte{7};
  auto bytes = encode(a);
  ShmAnswer back;
  ASSERT_TRUE(decode(bytes, &back).is_ok());
  EXPECT_EQ(back.ring, a.ring);
  for (size_t cut = 0; cut < bytes.size(); ++cut)
    EXPECT_FALSE(decode(std::span(bytes).first(cut), &back).is_ok()) << cut;
  bytes.push_back(std::byte{0});
  EXPECT_FALSE(decode(bytes, &back).is_ok());
  ShmAnswer no{false, "shared memory is off on this node", {}};
  ASSERT_TRUE(decode(encode(no), &back).is_ok());
  EXPECT_FALSE(back.accepted);
  EXPECT_EQ(back.reason, no.reason);
  EXPECT_EQ(encode(no).size(), 2 + no.reason.size());  // no record when declined
}

}  // namespace
}  // namespace pushpull::transport
