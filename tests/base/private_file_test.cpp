// SPDX-License-Identifier: Apache-2.0
// base/private_file.h: every failure is made to happen: a planted symlink,
// a FIFO, a hard link, and (as root) a file and directories owned by another
// uid, made by a process that really runs as uid 65534 (setpriv).
#include "base/private_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/timeline.h"
#include "pushpull/error.h"

namespace pushpull::base {
namespace {

namespace fs = std::filesystem;

constexpr uid_t kOther = 65534;  // nobody

// A sticky, world-writable directory (like /tmp), removed with everything in
// it even when the test fails.
class SharedDir {
 public:
  SharedDir() {
    std::string tmpl = (fs::temp_directory_path() / "pp-private-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
    ::chmod(path_.c_str(), 01777);
  }
  ~SharedDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void put(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

struct stat lstat_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st;
}

// Runs `script` as uid/gid 65534 with no groups; false when that cannot be
// done (not root, no setpriv).
bool as_other_user(const std::string& script) {
  if (::geteuid() != 0) return false;
  const std::string cmd =
      fmt::format("setpriv --reuid={0} --regid={0} --clear-groups sh -c '{1}'", kOther, script);
  return std::system(cmd.c_str()) == 0;
}

std::string expect_refused(const auto& write, const std::string& path, const std::string& why) {
  try {
    write();
  } catch (const IoError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find(why), std::string::npos) << m;
    return m;
  }
  ADD_FAILURE() << "writing " << path << " was not refused (" << why << ")";
  return "";
}

bool no_temporaries(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) return false;
  return true;
}

TEST(PrivateFile, NewFilesAre0600AndDirectories0700) {
  SharedDir d;
  const mode_t old = ::umask(0);  // the modes must not depend on the umask
  int fd = open_private_for_write(d / "stream", "test");
  ::umask(old);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_EQ(lstat_of(d / "stream").st_mode & 07777, 0600u);

  make_private_dirs(d / "a/b/c", "test");
  EXPECT_EQ(lstat_of(d / "a").st_mode & 07777, 0700u);
  EXPECT_EQ(lstat_of(d / "a/b/c").st_mode & 07777, 0700u);
  write_private_file(d / "a/b/c/ckpt", "new", "test");
  EXPECT_EQ(lstat_of(d / "a/b/c/ckpt").st_mode & 07777, 0600u);
  EXPECT_EQ(slurp(d / "a/b/c/ckpt"), "new");
  write_private_file(d / "a/b/c/ckpt", "newer", "test", /*durable=*/false);
  EXPECT_EQ(slurp(d / "a/b/c/ckpt"), "newer");
  EXPECT_TRUE(no_temporaries(d / "a/b/c"));
}

TEST(PrivateFile, AnOwnExistingFileIsTruncatedAndMadePrivate) {
  SharedDir d;
  put(d / "trace", "old old old");
  ::chmod((d / "trace").c_str(), 0644);
  std::FILE* f = fopen_private(d / "trace", "timeline");
  std::fputs("new", f);
  std::fclose(f);
  EXPECT_EQ(slurp(d / "trace"), "new");
  EXPECT_EQ(lstat_of(d / "trace").st_mode & 07777, 0600u);
}

TEST(PrivateFile, APlantedSymlinkIsNeverFollowed) {
  SharedDir d;
  put(d / "victim", "precious");
  fs::create_symlink(d / "victim", d / "trace.json");
  expect_refused([&] { ::close(open_private_for_write(d / "trace.json", "timeline")); },
                 d / "trace.json", "symbolic link");
  // The timeline's recorder opens its file through the helper.
  expect_refused([&] { timeline::Recorder r(d / "trace.json"); }, d / "trace.json",
                 "symbolic link");
  EXPECT_EQ(slurp(d / "victim"), "precious");

  // An atomic write replaces the link (this user's) and leaves its target.
  fs::create_symlink(d / "victim", d / "ckpt");
  write_private_file(d / "ckpt", "checkpoint", "checkpoint");
  EXPECT_TRUE(S_ISREG(lstat_of(d / "ckpt").st_mode));
  EXPECT_EQ(slurp(d / "ckpt"), "checkpoint");
  EXPECT_EQ(slurp(d / "victim"), "precious");
}

TEST(PrivateFile, AHardLinkOrAFifoIsRefused) {
  SharedDir d;
  put(d / "victim", "precious");
  ASSERT_EQ(::link((d / "victim").c_str(), (d / "log").c_str()), 0);
  expect_refused([&] { ::close(open_private_for_write(d / "log", "log file")); }, d / "log",
                 "2 hard links");
  EXPECT_EQ(slurp(d / "victim"), "precious");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  // Without O_NONBLOCK this open would block forever (no reader).
  EXPECT_THROW(::close(open_private_for_write(d / "fifo", "log file")), IoError);
}

TEST(PrivateFile, AnotherUsersFileIsNeverTruncatedOrReplaced) {
  SharedDir d;
  const std::string theirs = d / "metrics.worker0.jsonl";
  if (!as_other_user(fmt::format("echo theirs > {}", theirs)))
    GTEST_SKIP() << "needs root and setpriv to act as uid " << kOther;
  ASSERT_EQ(lstat_of(theirs).st_uid, kOther);
  expect_refused([&] { ::close(open_private_for_write(theirs, "metrics")); }, theirs,
                 "owned by uid 65534");
  expect_refused([&] { write_private_file(theirs, "mine", "checkpoint"); }, theirs,
                 "owned by uid 65534");
  EXPECT_EQ(slurp(theirs), "theirs\n");
  EXPECT_TRUE(no_temporaries(d.path()));

  // Their symlink to our file: refused by both ways of writing.
  put(d / "victim", "precious");
  ::chmod((d / "victim").c_str(), 0666);
  ASSERT_TRUE(as_other_user(fmt::format("ln -s {} {}", d / "victim", d / "link")));
  EXPECT_THROW(::close(open_private_for_write(d / "link", "log file")), IoError);
  expect_refused([&] { write_private_file(d / "link", "mine", "checkpoint"); }, d / "link",
                 "owned by uid 65534");
  EXPECT_EQ(slurp(d / "victim"), "precious");
}

TEST(PrivateFile, AnotherUsersDirectoryIsRefused) {
  SharedDir d;
  if (!as_other_user(fmt::format("mkdir {0}/round-0000000005 && ln -s /etc {0}/planted", d.path())))
    GTEST_SKIP() << "needs root and setpriv to act as uid " << kOther;
  expect_refused([&] { make_private_dirs(d / "round-0000000005", "checkpoint"); },
                 d / "round-0000000005", "owned by uid 65534");
  expect_refused([&] { make_private_dirs(d / "planted", "--log-dir"); }, d / "planted",
                 "symbolic link owned by uid 65534");
}

// A symlink another user planted on the way to a directory or a file
// (S/link/ckpt with S/link -> a directory of this user) is not followed:
// nothing is created or written behind it. One of this user's own is (a
// link to a scratch volume).
TEST(PrivateFile, AnotherUsersSymlinkOnTheWayIsRefused) {
  SharedDir d;
  const std::string victim = d / "victim-dir";
  ASSERT_EQ(::mkdir(victim.c_str(), 0700), 0);
  if (!as_other_user(fmt::format("ln -s {0}/victim-dir {0}/link", d.path())))
    GTEST_SKIP() << "needs root and setpriv to act as uid " << kOther;
  expect_refused([&] { make_private_dirs(d / "link/ckpt/round-0000000001", "checkpoint"); },
                 d / "link", "symbolic link owned by uid 65534");
  // Nor a file written through it, streamed or replaced.
  expect_refused([&] { ::close(open_private_for_write(d / "link/tl.json", "timeline")); },
                 d / "link", "symbolic link owned by uid 65534");
  expect_refused([&] { write_private_file(d / "link/states", "mine", "optimizer states"); },
                 d / "link", "symbolic link owned by uid 65534");
  EXPECT_TRUE(fs::is_empty(victim));
  ASSERT_EQ(::symlink(victim.c_str(), (d / "mine").c_str()), 0);
  make_private_dirs(d / "mine/ckpt", "checkpoint");
  EXPECT_TRUE(fs::is_directory(victim + "/ckpt"));
}

}  // namespace
}  // namespace pushpull::base
