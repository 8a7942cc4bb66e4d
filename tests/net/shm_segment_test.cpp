// SPDX-License-Identifier: Apache-2.0
// Shared-memory segment names (transport/shm/shm_segment.h): names left by
// killed processes or by creators that died are swept once stale, and only
// a segment's own names and well-formed setup messages are accepted.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>

#include "shm_fixture.h"
#include "transport/host_identity.h"
#include "transport/shm/shm_segment.h"
#include "transport/shm/shm_setup.h"

namespace pushpull::transport {
namespace {

using namespace std::chrono_literals;
using test::TempShmDir;

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
