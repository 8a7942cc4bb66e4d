// SPDX-License-Identifier: Apache-2.0
// Host identity for shared memory (shm_host.h) and use_shared_memory's
// choice (shm_data_transport.h): records survive the wire and bad ones are
// refused, a probe is seen only where it really is (transport::verify, whose
// refusals tests/net/host_proof_test.cpp checks), a group forms only when
// every member proved every other, and a job whose ranks are split over two
// segment directories ("hosts") moves data between ranks of one directory
// through shared memory and to the others over TCP, every pair correct.
#include "transport/shm/shm_host.h"

#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "collective/algorithms.h"
#include "tcp_group.h"
#include "transport/shm/shm_data_transport.h"
#include "transport/shm/shm_segment.h"

namespace pushpull::collective {

using transport::Clock;
using transport::decode_rank_record;
using transport::host_key;
using transport::HostProbe;
using transport::irecv;
using transport::isend;
using transport::kRankRecordBytes;
using transport::RankRecord;
using transport::Request;
using transport::SegmentsHook;
using transport::shm_group;
using transport::ShmDataTransport;
using transport::TcpTransport;
using transport::Transport;
using transport::use_shared_memory;

namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / fmt::format("pushpull-shmhost-{:x}{:x}", rd(), rd());
    fs::create_directory(path);
    fs::permissions(path, fs::perms::owner_all);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  size_t entries() const {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(path))
      ++n;
    return n;
  }
};

TEST(ShmHost, RecordsRoundTripAndBadOnesAreRefused) {
  RankRecord r;
  r.host.key = host_key("/dev/shm");
  r.host.file[0] = std::byte{1};
  r.host.content[15] = std::byte{2};
  r.token[7] = 3;
  auto wire = encode(r);
  ASSERT_EQ(wire.size(), kRankRecordBytes);
  RankRecord back = decode_rank_record(wire.data(), wire.size());
  EXPECT_EQ(back.host, r.host);
  EXPECT_EQ(back.token, r.token);

  EXPECT_THROW(decode_rank_record(wire.data(), wire.size() - 1), ProtocolError);
  auto bad_host = wire;
  bad_host[0] ^= 1;  // the host record's version
  EXPECT_THROW(decode_rank_record(bad_host.data(), bad_host.size()), ProtocolError);
  auto other_token = wire;
  other_token.back() ^= 1;  // the token is anything
  EXPECT_NE(decode_rank_record(other_token.data(), other_token.size()).token, r.token);
}

TEST(ShmHost, TheKeyNamesTheKernelTheNamespacesAndTheDirectory) {
  TempDir a, b;
  std::string ka = host_key(a.path.string()), kb = host_key(b.path.string());
  EXPECT_NE(ka, kb);  // another directory: another "host"
  EXPECT_EQ(ka, host_key(a.path.string()));
  EXPECT_NE(ka.find("net "), std::string::npos);
  EXPECT_NE(ka.find("pid "), std::string::npos);
}

// Two network-namespace "hosts" of one kernel are two hosts (the links
// between them are what such a setup measures). Needs CAP_SYS_ADMIN.
TEST(ShmHost, AnotherNetworkNamespaceIsAnotherHost) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the test runs before any other thread exists (it is first to fork)
    ::close(fds[0]);
    std::string key = ::unshare(CLONE_NEWNET) == 0 ? host_key("/dev/shm") : "";
    (void)!::write(fds[1], key.data(), key.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    got.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (got.empty()) GTEST_SKIP() << "no permission to make a network namespace";
  const std::string mine = host_key("/dev/shm");
  EXPECT_NE(got, mine);
  // Only the network namespace differs.
  EXPECT_EQ(got.substr(0, got.find("|net ")), mine.substr(0, mine.find("|net ")));
  EXPECT_EQ(got.substr(got.find("|pid ")), mine.substr(mine.find("|pid ")));
}

TEST(ShmHost, AProbeIsSeenOnlyWhereItIsAndLeavesNothing) {
  TempDir a, b;
  {
    HostProbe pa(a.path.string()), pa2(a.path.string()), pb(b.path.string());
    EXPECT_TRUE(pa2.sees(pa.record()));
    EXPECT_FALSE(pb.sees(pa.record()));  // not in b's directory
    RankRecord forged = pa.record();
    forged.host.content[0] ^= std::byte{1};
    EXPECT_FALSE(pa2.sees(forged));  // the file is there, the content is not
    forged = pa.record();
    forged.host.key = host_key(b.path.string());
    EXPECT_FALSE(pa2.sees(forged));  // another host's key
    {  // A PS ring's record (the same proof, another kind of file) is no probe.
      std::unique_ptr<transport::ShmSegment> ring;
      ASSERT_TRUE(transport::ShmSegment::create(64 << 10, a.path.string(), &ring).is_ok());
      EXPECT_FALSE(pa2.sees(RankRecord{ring->record(), {}}));
    }
    EXPECT_TRUE(pa.reserve(1 << 16));
    EXPECT_EQ(a.entries(), 3u);          // two probes and pa's reservation
    EXPECT_TRUE(pa2.sees(pa.record()));  // the probe keeps its size
    pa.remove();
    EXPECT_EQ(a.entries(), 1u);  // the probe and its reservation went
    EXPECT_FALSE(pa2.sees(pa.record()));
  }
  EXPECT_EQ(a.entries(), 0u);
  EXPECT_EQ(b.entries(), 0u);
}

TEST(ShmHost, AGroupNeedsEveryProof) {
  std::vector<RankRecord> recs(4);
  recs[0].host.key = recs[1].host.key = recs[3].host.key = "host A";
  recs[2].host.key = "host B";
  std::vector<std::vector<uint8_t>> proof(4, std::vector<uint8_t>(4, 1));
  EXPECT_EQ(shm_group(recs, proof, 0), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(shm_group(recs, proof, 3), (std::vector<int>{0, 1, 3}));
  EXPECT_TRUE(shm_group(recs, proof, 2).empty());  // alone on its host
  proof[3][1] = 0;                                 // rank 3 cannot see rank 1's probe
  EXPECT_TRUE(shm_group(recs, proof, 0).empty());
  EXPECT_TRUE(shm_group(recs, proof, 1).empty());
  proof[3][1] = 1;
  proof[1][1] = 0;  // rank 1 could not reserve its segment
  EXPECT_TRUE(shm_group(recs, proof, 3).empty());
  proof[1] = {1, 1};  // a short row (a malformed proof) proves nothing
  EXPECT_TRUE(shm_group(recs, proof, 0).empty());
}

// Runs use_shared_memory on every rank (rank r with dirs[r]) at once.
std::vector<std::unique_ptr<Transport>> choose(std::vector<std::unique_ptr<TcpTransport>> tcp,
                                               const std::vector<std::string>& dirs,
                                               bool enabled = true, uint64_t stream_below = 0,
                                               const SegmentsHook& hook = {}) {
  CollectiveOptions c;
  c.shared_memory = enabled;
  c.shm_min_message_bytes = stream_below;
  const size_t n = tcp.size();
  std::vector<std::unique_ptr<Transport>> out(n);
  std::vector<std::thread> th;
  for (size_t r = 0; r < n; ++r)
    th.emplace_back(
        [&, r] { out[r] = use_shared_memory(std::move(tcp[r]), c, Millis(10000), dirs[r], hook); });
  for (auto& t : th)
    t.join();
  return out;
}

// Every ordered pair exchanges a message; all arrive intact.
void every_pair_talks(std::vector<std::unique_ptr<Transport>>& ts) {
  const int n = static_cast<int>(ts.size());
  const size_t bytes = 300001;
  std::vector<std::vector<uint8_t>> in(static_cast<size_t>(n * n), std::vector<uint8_t>(bytes));
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n * n));
  std::vector<Request> reqs;
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      auto& o = out[static_cast<size_t>(s * n + d)];
      o.resize(bytes);
      for (size_t i = 0; i < bytes; ++i)
        o[i] = static_cast<uint8_t>(i * 7 + s * 31 + d);
      reqs.push_back(irecv(*ts[d], s, 5, in[static_cast<size_t>(s * n + d)].data(), bytes));
      reqs.push_back(isend(*ts[s], d, 5, o.data(), bytes));
    }
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (auto& r : reqs)
    r.wait(deadline, "a message between two ranks");
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      EXPECT_EQ(in[static_cast<size_t>(s * n + d)], out[static_cast<size_t>(s * n + d)])
          << s << " -> " << d;
    }
}

TEST(UseSharedMemory, RanksOfOneDirectoryShareTheOthersUseTcp) {
  TempDir a, b;
  auto ts = choose(testing::connect_tcp_group(4),
                   {a.path.string(), a.path.string(), b.path.string(), a.path.string()});
  auto* s0 = dynamic_cast<ShmDataTransport*>(ts[0].get());
  ASSERT_NE(s0, nullptr);
  EXPECT_EQ(s0->group(), (std::vector<int>{0, 1, 3}));
  EXPECT_NE(dynamic_cast<ShmDataTransport*>(ts[3].get()), nullptr);
  auto* s2 = dynamic_cast<ShmDataTransport*>(ts[2].get());  // alone in b: TCP only
  ASSERT_NE(s2, nullptr);
  EXPECT_TRUE(s2->group().empty());
  every_pair_talks(ts);
  // No rank offers direct streams (every rank must take the same path), the
  // one alone in b included.
  for (auto& t : ts)
    for (int peer = 0; peer < 4; ++peer)
      EXPECT_FALSE(t->runs_direct_to(peer));
  // A ring allreduce over the mixed transport (1 MiB segments: several units).
  std::vector<std::vector<float>> data(4, std::vector<float>(700001));
  std::vector<std::thread> th;
  for (int r = 0; r < 4; ++r)
    th.emplace_back([&, r] {
      auto& d = data[static_cast<size_t>(r)];
      for (size_t i = 0; i < d.size(); ++i)
        d[i] = static_cast<float>((i % 97) + r);
      std::vector<char> scratch;
      AlgoContext ctx{*ts[static_cast<size_t>(r)]};
      ctx.op_id = 7;
      ctx.scratch = &scratch;
      allreduce(ctx, d.data(), d.size(), DType::kFloat32, ReduceOp::kSum);
    });
  for (auto& t : th)
    t.join();
  for (int r = 0; r < 4; ++r)
    for (size_t i : {size_t{0}, size_t{12345}, data[0].size() - 1})
      EXPECT_EQ(data[static_cast<size_t>(r)][i], static_cast<float>(4 * (i % 97) + 6)) << r;
  EXPECT_EQ(a.entries(), 0u);  // probes removed, segments unlinked once mapped
  EXPECT_EQ(b.entries(), 0u);
  for (auto& t : ts)
    t->close(Status(ErrorCode::kPeerFailure, "test over"));
}

// PUSHPULL_SHM_MIN_MESSAGE_BYTES: operations of small messages run on the
// TCP mesh's direct streams on every rank (the one alone on its host too,
// so all take the same path), larger ones through shared memory; both give
// the right sums, one after the other on the same transports.
TEST(UseSharedMemory, SmallMessagesRideTheMeshStreamsLargeOnesSharedMemory) {
  TempDir a, b;
  const uint64_t below = 64 << 10;
  auto ts = choose(testing::connect_tcp_group(3),
                   {a.path.string(), a.path.string(), b.path.string()}, true, below);
  for (auto& t : ts) {
    auto* s = dynamic_cast<ShmDataTransport*>(t.get());
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(s->streams_for(4096));
    EXPECT_TRUE(s->streams_for(below - 1));
    EXPECT_FALSE(s->streams_for(below));
    EXPECT_FALSE(t->runs_direct_to((t->rank() + 1) % 3));
  }
  // 1,000 floats: halving-doubling on the streams; 300,000: a ring whose
  // 400 KB blocks go through shared memory; then small again.
  const std::vector<size_t> counts = {1000, 300000, 7};
  std::vector<std::vector<std::vector<float>>> data(3);
  std::vector<std::thread> th;
  for (int r = 0; r < 3; ++r)
    th.emplace_back([&, r] {
      std::vector<char> scratch;
      AlgoContext ctx{*ts[static_cast<size_t>(r)]};
      ctx.scratch = &scratch;
      for (size_t k = 0; k < counts.size(); ++k) {
        auto& d = data[static_cast<size_t>(r)].emplace_back(counts[k]);
        for (size_t i = 0; i < d.size(); ++i)
          d[i] = static_cast<float>((i % 89) + r + k);
        ctx.op_id = 20 + k;
        allreduce(ctx, d.data(), d.size(), DType::kFloat32, ReduceOp::kSum);
      }
    });
  for (auto& t : th)
    t.join();
  for (int r = 0; r < 3; ++r)
    for (size_t k = 0; k < counts.size(); ++k) {
      const auto& d = data[static_cast<size_t>(r)][k];
      for (size_t i : {size_t{0}, d.size() / 2, d.size() - 1})
        EXPECT_EQ(d[i], static_cast<float>(3 * (i % 89) + 3 + 3 * k)) << r << " " << k;
    }
  for (auto& t : ts)
    t->close(Status(ErrorCode::kPeerFailure, "test over"));
}

TEST(UseSharedMemory, OffMeansTcpAndAnUnusableDirectoryFallsBackToTcp) {
  TempDir a;
  auto off = choose(testing::connect_tcp_group(2), {a.path.string(), a.path.string()}, false);
  EXPECT_NE(dynamic_cast<TcpTransport*>(off[0].get()), nullptr);
  EXPECT_NE(dynamic_cast<TcpTransport*>(off[1].get()), nullptr);
  EXPECT_EQ(a.entries(), 0u);
  // No directory to make probes in: every rank keeps TCP, none waits.
  const std::string missing = (a.path / "missing").string();
  auto ts = choose(testing::connect_tcp_group(2), {missing, missing});
  EXPECT_NE(dynamic_cast<TcpTransport*>(ts[0].get()), nullptr);
  EXPECT_NE(dynamic_cast<TcpTransport*>(ts[1].get()), nullptr);
  every_pair_talks(ts);
  for (auto& t : ts)
    t->close(Status(ErrorCode::kPeerFailure, "test over"));
}

TEST(UseSharedMemory, AVerdictOfTheMeshFailsSharedMemoryOperations) {
  TempDir a;
  auto tcp = testing::connect_tcp_group(2);
  TcpTransport* mesh0 = tcp[0].get();
  auto ts = choose(std::move(tcp), {a.path.string(), a.path.string()});
  ASSERT_NE(dynamic_cast<ShmDataTransport*>(ts[0].get()), nullptr);
  std::vector<uint8_t> buf(16);
  Request r = irecv(*ts[0], 1, 9, buf.data(), buf.size());  // data: through shared memory
  mesh0->declare(Status(ErrorCode::kPeerFailure, "collective: rank 1 stopped answering"));
  try {
    r.wait(Clock::now() + std::chrono::seconds(10), "the receive");
    FAIL() << "the receive completed";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 stopped answering"), std::string::npos);
  }
  for (auto& t : ts)
    t->close(Status(ErrorCode::kPeerFailure, "test over"));
}

namespace squat {

// A ring allreduce over every rank's transport; every value checked.
void allreduce_is_right(std::vector<std::unique_ptr<Transport>>& ts) {
  const int n = static_cast<int>(ts.size());
  std::vector<std::vector<float>> data(static_cast<size_t>(n), std::vector<float>(300001));
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      auto& d = data[static_cast<size_t>(r)];
      for (size_t i = 0; i < d.size(); ++i)
        d[i] = static_cast<float>((i % 89) + r);
      std::vector<char> scratch;
      AlgoContext ctx{*ts[static_cast<size_t>(r)]};
      ctx.op_id = 11;
      ctx.scratch = &scratch;
      allreduce(ctx, d.data(), d.size(), DType::kFloat32, ReduceOp::kSum);
    });
  for (auto& t : th)
    t.join();
  const float ranks = static_cast<float>(n * (n - 1) / 2);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < data[0].size(); ++i)
      ASSERT_EQ(data[static_cast<size_t>(r)][i], static_cast<float>(n) * (i % 89) + ranks)
          << "rank " << r << " element " << i;
}

bool hex32(const std::string& s) {
  return s.size() == 32 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace squat

// Each rank's segment has a name of its own random 128 bits: seeing one in
// /dev/shm (inotify) tells another user nothing about the next.
TEST(UseSharedMemory, EveryRanksSegmentNameIsItsOwnRandomName) {
  TempDir a;
  std::mutex mu;
  std::vector<std::string> seen;
  auto ts =
      choose(testing::connect_tcp_group(3), {a.path.string(), a.path.string(), a.path.string()},
             true, 0, [&](int me, const std::vector<std::string>& names) {
               std::lock_guard lock(mu);
               if (me == 0) seen = names;
             });
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& n : seen) {
    ASSERT_TRUE(n.starts_with("pushpull-coll-")) << n;
    EXPECT_TRUE(squat::hex32(n.substr(14))) << n;
  }
  // No two share their random part, not even a 4-byte run of it.
  for (size_t i = 0; i < 3; ++i)
    for (size_t j = 0; j < 3; ++j)
      for (size_t k = 0; i != j && k + 8 <= 32; k += 8) {
        EXPECT_EQ(seen[j].find(seen[i].substr(14 + k, 8)), std::string::npos)
            << seen[i] << " " << seen[j];
      }
  EXPECT_EQ(dynamic_cast<ShmDataTransport*>(ts[0].get())->group(), (std::vector<int>{0, 1, 2}));
  squat::allreduce_is_right(ts);
  EXPECT_EQ(a.entries(), 0u);
  for (auto& t : ts)
    t->close(Status(ErrorCode::kPeerFailure, "test over"));
}

// A squatter who wins the race for a segment's name (here the test hands it
// the names; in a job nobody can predict them): the group falls back to TCP
// together, the job's values are right, nothing of the job is left behind,
// and what the squatter made is untouched. Squats: a file of another uid
// (setpriv as 65534, when root), a plain file, a symlink to a victim file.
enum class Squat { kOtherUser, kFile, kSymlink };

class ShmSquat : public ::testing::TestWithParam<Squat> {};

TEST_P(ShmSquat, ASquattedSegmentFallsBackToTcpAndTheJobIsRight) {
  TempDir a;
  fs::permissions(a.path, fs::perms::all | fs::perms::sticky_bit);  // like /dev/shm
  const Squat how = GetParam();
  if (how == Squat::kOtherUser && ::geteuid() != 0) GTEST_SKIP() << "needs root for setpriv";
  const fs::path victim = fs::temp_directory_path() / fmt::format("pp-victim-{}", ::getpid());
  { std::ofstream(victim) << "precious"; }
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove(p, ec);
    }
  } cleanup{victim};
  std::string squatted;
  bool squat_made = false;
  auto hook = [&](int me, const std::vector<std::string>& names) {
    if (me != 1) return;  // rank 1's own name, before rank 1 makes it
    squatted = (a.path / names[1]).string();
    switch (how) {
      case Squat::kOtherUser:
        squat_made = std::system(fmt::format("setpriv --reuid=65534 --regid=65534 "
                                             "--clear-groups sh -c 'echo squat > {}'",
                                             squatted)
                                     .c_str()) == 0;
        break;
      case Squat::kFile:
        std::ofstream(squatted) << "squat";
        squat_made = true;
        break;
      case Squat::kSymlink:
        fs::create_symlink(victim, squatted);
        squat_made = true;
        break;
    }
  };
  ::testing::internal::CaptureStderr();
  auto ts = choose(testing::connect_tcp_group(3),
                   {a.path.string(), a.path.string(), a.path.string()}, true, 0, hook);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(squat_made);
  // One warning line for the job (from rank 1, which could not make its
  // segment), naming the squatted path; the other ranks say it at INFO.
  size_t warnings = 0;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);)
    if (line.starts_with("[pushpull W") && line.find("shared memory") != std::string::npos &&
        line.find("secret") == std::string::npos) {
      ++warnings;
      EXPECT_NE(line.find(squatted), std::string::npos) << line;
      EXPECT_NE(line.find("over TCP instead of shared memory"), std::string::npos) << line;
    }
  EXPECT_EQ(warnings, 1u) << log;
  for (auto& t : ts) {
    auto* s = dynamic_cast<ShmDataTransport*>(t.get());
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(s->group().empty()) << "a rank kept shared memory beside a squatted segment";
    EXPECT_FALSE(t->runs_direct_to((t->rank() + 1) %
                                   static_cast<int>(ts.size())));  // every rank takes the same path
  }
  every_pair_talks(ts);
  squat::allreduce_is_right(ts);
  // Only the squatter's name is left, as the squatter made it.
  EXPECT_EQ(a.entries(), 1u);
  struct stat st {};
  ASSERT_EQ(::lstat(squatted.c_str(), &st), 0);
  if (how == Squat::kOtherUser) {
    EXPECT_EQ(st.st_uid, 65534u);
  }
  if (how == Squat::kSymlink) {
    EXPECT_TRUE(S_ISLNK(st.st_mode));
  }
  std::ifstream in(victim);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "precious");
  for (auto& t : ts)
    t->close(Status(ErrorCode::kPeerFailure, "test over"));
}

INSTANTIATE_TEST_SUITE_P(Squats, ShmSquat,
                         ::testing::Values(Squat::kOtherUser, Squat::kFile, Squat::kSymlink),
                         [](const auto& info) {
                           switch (info.param) {
                             case Squat::kOtherUser:
                               return "AnotherUsersFile";
                             case Squat::kFile:
                               return "AFile";
                             default:
                               return "ASymlink";
                           }
                         });

}  // namespace
}  // namespace pushpull::collective
