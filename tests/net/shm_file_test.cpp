// SPDX-License-Identifier: Apache-2.0
// The one shared-memory file primitive (transport/shm/shm_file.h): what create()
// makes (private, reserved, unguessable, never over an existing name), and
// every file open() and adopt() refuse: open to others, another user's, a
// symlink, a FIFO, the wrong size, a name of the wrong form; a peer's file
// mapped read-only cannot be written; names left by dead processes swept.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <string>

#include "transport/shm/shm_file.h"

namespace pushpull::transport {
namespace {

constexpr ShmKind kKind{"pushpull-test-", 32};

// A private directory on tmpfs, emptied and removed at the end.
struct TempShmDir {
  TempShmDir() {
    char t[] = "/dev/shm/pushpull-shmfile-XXXXXX";
    EXPECT_NE(::mkdtemp(t), nullptr);
    path = t;
  }
  ~TempShmDir() {
    for (const std::string& n : made)
      ::unlink((path + "/" + n).c_str());
    ::rmdir(path.c_str());
  }
  // A file `name` made by hand (as another process or user would).
  std::string make(const std::string& name, mode_t mode, off_t bytes) {
    made.push_back(name);
    const std::string p = path + "/" + name;
    const int fd = ::open(p.c_str(), O_CREAT | O_EXCL | O_RDWR, mode);
    EXPECT_GE(fd, 0) << p;
    EXPECT_EQ(::fchmod(fd, mode), 0);  // past the umask
    EXPECT_EQ(::ftruncate(fd, bytes), 0);
    ::close(fd);
    return p;
  }
  bool exists(const std::string& name) const {
    struct stat st {};
    return ::lstat((path + "/" + name).c_str(), &st) == 0;
  }
  std::string path;
  std::vector<std::string> made;
};

std::string name_of(char digit) {
  return std::string(kKind.prefix) + std::string(32, digit);
}

TEST(ShmFile, CreateMakesAPrivateReservedFileUnderAnUnguessableName) {
  TempShmDir dir;
  std::unique_ptr<ShmFile> a, b;
  ASSERT_TRUE(ShmFile::create(dir.path, kKind, 1 << 20, {}, &a).is_ok());
  ASSERT_TRUE(ShmFile::create(dir.path, kKind, 1 << 20, {}, &b).is_ok());
  EXPECT_TRUE(ShmFile::valid_name(a->name(), kKind)) << a->name();
  EXPECT_NE(a->name(), b->name());
  EXPECT_EQ(a->name(), std::string(kKind.prefix) + to_hex(a->id().data(), a->id().size()));
  struct stat st {};
  ASSERT_EQ(::stat((dir.path + "/" + a->name()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 1 << 20);
  EXPECT_GE(st.st_blocks * 512, 1 << 20) << "the pages were not reserved";
  // Writable by its creator, and its bytes seen by whoever opens it.
  std::memset(a->data(), 0x5a, a->size());
  std::unique_ptr<ShmFile> peer;
  Status s = ShmFile::open(dir.path, a->name(), kKind, 1 << 20, 1 << 20, {}, &peer);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(peer->data()[12345], std::byte{0x5a});
  // Never over an existing name (O_EXCL), and never a name of another form.
  std::unique_ptr<ShmFile> again;
  EXPECT_EQ(ShmFile::create_named(dir.path, a->name(), kKind, 4096, {}, &again).code(),
            ErrorCode::kIoError);
  EXPECT_EQ(ShmFile::create_named(dir.path, "../escape", kKind, 4096, {}, &again).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_FALSE(again);
  a->unlink();
  EXPECT_FALSE(dir.exists(a->name()));
  EXPECT_EQ(peer->data()[0], std::byte{0x5a}) << "the mapping outlives the name";
  const std::string bname = b->name();
  b.reset();
  EXPECT_FALSE(dir.exists(bname)) << "the destructor leaves the name behind";
}

TEST(ShmFile, OpenRefusesEveryFileThatIsNotThisUsersPrivateOneOfTheRightSize) {
  TempShmDir dir;
  std::unique_ptr<ShmFile> f;
  auto open = [&](const std::string& name, uint64_t bytes = 8192) {
    f.reset();
    return ShmFile::open(dir.path, name, kKind, bytes, bytes, {}, &f);
  };
  // The good one, for contrast.
  dir.make(name_of('0'), 0600, 8192);
  EXPECT_TRUE(open(name_of('0')).is_ok());
  // Readable or writable by group or others.
  for (const auto& [mode, digit] :
       {std::pair<mode_t, char>{0640, '1'}, {0604, '2'}, {0620, '3'}, {0602, '4'}, {0666, '5'}}) {
    const std::string n = name_of(digit);
    dir.make(n, mode, 8192);
    Status s = open(n);
    EXPECT_EQ(s.code(), ErrorCode::kIoError) << std::oct << mode;
    EXPECT_NE(s.message().find("refusing"), std::string::npos) << s.message();
    EXPECT_FALSE(f);
  }
  // A symlink to a good file: not followed.
  ASSERT_EQ(
      ::symlink((dir.path + "/" + name_of('0')).c_str(), (dir.path + "/" + name_of('a')).c_str()),
      0);
  dir.made.push_back(name_of('a'));
  EXPECT_EQ(open(name_of('a')).code(), ErrorCode::kIoError);
  // A FIFO: refused without blocking in open().
  ASSERT_EQ(::mkfifo((dir.path + "/" + name_of('b')).c_str(), 0600), 0);
  dir.made.push_back(name_of('b'));
  EXPECT_EQ(open(name_of('b')).code(), ErrorCode::kIoError);
  // The wrong size, either way, and an empty file.
  EXPECT_EQ(open(name_of('0'), 4096).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(open(name_of('0'), 16384).code(), ErrorCode::kProtocolError);
  dir.make(name_of('c'), 0600, 0);
  EXPECT_EQ(ShmFile::open(dir.path, name_of('c'), kKind, 0, 1 << 20, {}, &f).code(),
            ErrorCode::kProtocolError);
  // Names of another form, before anything is opened.
  for (const std::string& bad :
       {std::string("../../etc/passwd"), std::string(kKind.prefix), std::string("pushpull-x"),
        std::string(kKind.prefix) + std::string(32, 'A'),
        std::string(kKind.prefix) + std::string(31, '0') + "/",
        std::string(kKind.prefix) + std::string(33, '0')})
    EXPECT_EQ(open(bad).code(), ErrorCode::kProtocolError) << bad;
  EXPECT_EQ(open(name_of('d')).code(), ErrorCode::kNotFound);
  EXPECT_FALSE(f);
}

TEST(ShmFile, AnotherUsersFileIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a file of another user";
  TempShmDir dir;
  const std::string p = dir.make(name_of('e'), 0600, 4096);
  ASSERT_EQ(::chown(p.c_str(), 65534, 65534), 0);
  std::unique_ptr<ShmFile> f;
  Status s = ShmFile::open(dir.path, name_of('e'), kKind, 4096, 4096, {}, &f);
  EXPECT_EQ(s.code(), ErrorCode::kIoError);
  EXPECT_NE(s.message().find("another user"), std::string::npos) << s.message();
  // adopt() (a descriptor from /proc) checks the owner as well.
  std::unique_ptr<ShmFile> g;
  EXPECT_EQ(ShmFile::adopt(Fd(::open(p.c_str(), O_RDONLY)), p, 4096, {}, &g).code(),
            ErrorCode::kIoError);
  EXPECT_FALSE(g);
}

// A peer's file mapped read-only: a write through it faults instead of
// changing the creator's bytes.
TEST(ShmFile, AReadOnlyMappingCannotBeWritten) {
  TempShmDir dir;
  std::unique_ptr<ShmFile> mine, theirs;
  ASSERT_TRUE(ShmFile::create(dir.path, kKind, 4096, {}, &mine).is_ok());
  ASSERT_TRUE(ShmFile::open(dir.path, mine->name(), kKind, 4096, 4096, {}, &theirs).is_ok());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGSEGV, SIG_DFL);  // a sanitizer's handler would exit instead
    theirs->data()[0] = std::byte{1};
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << status;
  EXPECT_EQ(mine->data()[0], std::byte{0});
}

TEST(ShmFile, AMemfdIsSealedAndAdoptChecksItsSize) {
  std::unique_ptr<ShmFile> m;
  ASSERT_TRUE(ShmFile::create_memfd(kKind, 1 << 16, &m).is_ok());
  EXPECT_TRUE(ShmFile::valid_name(m->name(), kKind));
  EXPECT_NE(::ftruncate(m->fd(), 4096), 0) << "a memfd that can shrink";
  const int seals = ::fcntl(m->fd(), F_GET_SEALS);
  EXPECT_TRUE((seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW) && (seals & F_SEAL_SEAL));
  const std::string proc = "/proc/self/fd/" + std::to_string(m->fd());
  std::unique_ptr<ShmFile> a;
  EXPECT_EQ(ShmFile::adopt(Fd(::open(proc.c_str(), O_RDONLY)), proc, 4096, {}, &a).code(),
            ErrorCode::kIoError);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[1]);
  EXPECT_EQ(ShmFile::adopt(Fd(pipe_fds[0]), "a pipe", 4096, {}, &a).code(), ErrorCode::kIoError);
  m->data()[7] = std::byte{9};
  ASSERT_TRUE(ShmFile::adopt(Fd(::open(proc.c_str(), O_RDONLY)), proc, 1 << 16, {}, &a).is_ok());
  EXPECT_EQ(a->data()[7], std::byte{9});
}

// Names a process killed before it unlinked them leave behind: swept once
// stale, or earlier once their creator is gone; only this kind's regular
// files, never through a symlink.
TEST(ShmFile, NamesLeftByADeadProcessAreSwept) {
  TempShmDir dir;
  int names[2];
  ASSERT_EQ(::pipe(names), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::unique_ptr<ShmFile> f;
    if (!ShmFile::create(dir.path, kKind, 4096, {}, &f).is_ok()) ::_exit(2);
    const pid_t me = ::getpid();
    std::memcpy(f->data(), &me, sizeof me);  // what a creator_gone reads
    const std::string n = f->name();
    f.release();  // the process "dies" with the name linked
    ::_exit(::write(names[1], n.data(), n.size()) == static_cast<ssize_t>(n.size()) ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::string orphan(kKind.prefix.size() + 32, '\0');
  ASSERT_EQ(::read(names[0], orphan.data(), orphan.size()), static_cast<ssize_t>(orphan.size()));
  ::close(names[0]);
  ::close(names[1]);
  dir.made.push_back(orphan);
  auto age = [&](const std::string& name, int seconds) {
    timespec t[2];
    t[0].tv_sec = t[1].tv_sec = ::time(nullptr) - seconds;
    t[0].tv_nsec = t[1].tv_nsec = 0;
    EXPECT_EQ(::utimensat(AT_FDCWD, (dir.path + "/" + name).c_str(), t, AT_SYMLINK_NOFOLLOW), 0);
  };
  std::unique_ptr<ShmFile> live;
  ASSERT_TRUE(ShmFile::create(dir.path, kKind, 4096, {}, &live).is_ok());
  const pid_t me = ::getpid();
  std::memcpy(live->data(), &me, sizeof me);
  dir.make(name_of('1'), 0600, 4096);  // stale, whoever made it
  dir.make("pushpull-other-kind", 0600, 4096);
  ASSERT_EQ(::symlink((dir.path + "/pushpull-other-kind").c_str(),
                      (dir.path + "/" + name_of('2')).c_str()),
            0);
  dir.made.push_back(name_of('2'));
  for (const std::string& n : {name_of('1'), std::string("pushpull-other-kind"), name_of('2')})
    age(n, 7200);
  age(orphan, 300);
  age(live->name(), 300);
  const auto gone = [](int fd) {
    pid_t pid = 0;
    return ::pread(fd, &pid, sizeof pid, 0) == sizeof pid && pid > 0 && ::kill(pid, 0) != 0 &&
           errno == ESRCH;
  };
  using std::chrono::seconds;
  // Without the creator check only the stale one goes.
  EXPECT_EQ(ShmFile::sweep_stale(dir.path, kKind, seconds{3600}), 1);
  EXPECT_FALSE(dir.exists(name_of('1')));
  EXPECT_TRUE(dir.exists(orphan));
  // With it, the dead creator's goes too; the live one's and the young stay.
  EXPECT_EQ(ShmFile::sweep_stale(dir.path, kKind, seconds{3600}, seconds{600}, gone), 0);
  EXPECT_EQ(ShmFile::sweep_stale(dir.path, kKind, seconds{3600}, seconds{120}, gone), 1);
  EXPECT_FALSE(dir.exists(orphan));
  EXPECT_TRUE(dir.exists(live->name()));
  EXPECT_TRUE(dir.exists("pushpull-other-kind"));
  EXPECT_TRUE(dir.exists(name_of('2'))) << "a symlink was removed or followed";
}

}  // namespace
}  // namespace pushpull::transport
