// SPDX-License-Identifier: Apache-2.0
// Segment names a squatter could take (shm_data_transport.h): every rank's
// segment has a random name of its own, and a squatter who wins the race for
// a name makes that pair fall back to TCP while the job stays right.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <mutex>

#include "collective/algorithms.h"
#include "shm_host_fixture.h"
#include "transport/shm/shm_segment.h"

namespace pushpull::collective {
namespace {

using namespace shm_testing;

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
