// SPDX-License-Identifier: Apache-2.0
// The per-user job secret file (src/base/secret_file.h) and how
// Options::from_env() picks the job secret: each test makes the situation an
// attacker or a broken setup would (a readable file, a foreign one, a
// planted link, racing creators, no usable home) and checks the outcome.
#include "base/secret_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull {
namespace {

namespace fs = std::filesystem;

// A private temporary directory, removed with everything in it.
struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/pp-secret-test.XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    EXPECT_NE(d, nullptr);
    path = d ? d : "";
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

mode_t mode_of(const std::string& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

void write_file(const std::string& p, const std::string& text, mode_t mode) {
  std::ofstream(p) << text;
  ASSERT_EQ(::chmod(p.c_str(), mode), 0);
}

bool is_hex64(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST(SecretFile, CreatedOnFirstUsePrivateAndStable) {
  TempDir t;
  const std::string path = t.path + "/cfg/pushpull/secret";
  Environment env{{"PUSHPULL_SECRET_FILE", path}};
  base::UserSecret first = base::user_secret(env);
  EXPECT_TRUE(first.created);
  EXPECT_FALSE(first.fallback);
  EXPECT_EQ(first.path, path);
  EXPECT_TRUE(is_hex64(first.secret)) << first.secret;
  EXPECT_EQ(mode_of(path), 0600u);
  EXPECT_EQ(mode_of(t.path + "/cfg/pushpull"), 0700u);
  base::UserSecret again = base::user_secret(env);
  EXPECT_FALSE(again.created);
  EXPECT_EQ(again.secret, first.secret);
  // No temporary files left behind.
  size_t entries = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(t.path + "/cfg/pushpull"))
    ++entries;
  EXPECT_EQ(entries, 1u);
}

TEST(SecretFile, DefaultPlaceFollowsXdgThenHome) {
  EXPECT_EQ(base::user_secret_path(Environment{{"HOME", "/h"}}), "/h/.config/pushpull/secret");
  EXPECT_EQ(base::user_secret_path(Environment{{"HOME", "/h"}, {"XDG_CONFIG_HOME", "/x"}}),
            "/x/pushpull/secret");
  // A relative XDG_CONFIG_HOME is invalid (XDG base directory spec): ignored.
  EXPECT_EQ(base::user_secret_path(Environment{{"HOME", "/h"}, {"XDG_CONFIG_HOME", "rel"}}),
            "/h/.config/pushpull/secret");
  EXPECT_EQ(base::user_secret_path(Environment{{"HOME", "/h"}, {"PUSHPULL_SECRET_FILE", "/f"}}),
            "/f");
  TempDir t;
  base::UserSecret s = base::user_secret(Environment{{"HOME", t.path}});
  EXPECT_EQ(s.path, t.path + "/.config/pushpull/secret");
  EXPECT_TRUE(s.created);
}

// Processes racing to create the file all end up with the one secret.
TEST(SecretFile, RacingCreatorsAgree) {
  for (int round = 0; round < 5; ++round) {
    TempDir t;
    const std::string path = t.path + "/pushpull/secret";
    constexpr int kProcs = 8;
    int fds[kProcs][2];
    pid_t pids[kProcs];
    for (int i = 0; i < kProcs; ++i) {
      ASSERT_EQ(::pipe(fds[i]), 0);
      pids[i] = ::fork();
      ASSERT_GE(pids[i], 0);
      if (pids[i] == 0) {
        std::string s;
        try {
          s = base::load_or_create_secret(path).secret;
        } catch (const std::exception& e) {
          s = std::string("error: ") + e.what();
        }
        (void)!::write(fds[i][1], s.data(), s.size());
        ::_exit(0);
      }
      ::close(fds[i][1]);
    }
    std::set<std::string> seen;
    for (int i = 0; i < kProcs; ++i) {
      std::string s;
      char buf[256];
      ssize_t n;
      while ((n = ::read(fds[i][0], buf, sizeof buf)) > 0)
        s.append(buf, size_t(n));
      ::close(fds[i][0]);
      int status = 0;
      ::waitpid(pids[i], &status, 0);
      seen.insert(s);
    }
    ASSERT_EQ(seen.size(), 1u) << *seen.begin() << " / " << *seen.rbegin();
    EXPECT_TRUE(is_hex64(*seen.begin())) << *seen.begin();
    EXPECT_EQ(base::read_secret_file(path), *seen.begin());
  }
}

TEST(SecretFile, AFileOthersCanReadIsRefusedNamingThePath) {
  TempDir t;
  const std::string path = t.path + "/secret";
  write_file(path, "abc\n", 0644);
  try {
    base::load_or_create_secret(path);
    FAIL() << "a world-readable secret file was used";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("chmod 600"), std::string::npos) << e.what();
  }
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  EXPECT_THROW(base::read_secret_file(path), InvalidArgument);
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_EQ(base::read_secret_file(path), "abc");
  // Not "fixed" behind the user's back either.
  ASSERT_EQ(::chmod(path.c_str(), 0604), 0);
  EXPECT_THROW(base::user_secret(Environment{{"PUSHPULL_SECRET_FILE", path}}), InvalidArgument);
  EXPECT_EQ(mode_of(path), 0604u);
}

TEST(SecretFile, APlantedSymbolicLinkIsNotFollowed) {
  TempDir t;
  const std::string target = t.path + "/elsewhere";
  write_file(target, "attacker-known\n", 0600);
  const std::string path = t.path + "/secret";
  ASSERT_EQ(::symlink(target.c_str(), path.c_str()), 0);
  try {
    base::load_or_create_secret(path);
    FAIL() << "the secret was read through a symbolic link";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic link"), std::string::npos) << e.what();
  }
  // A dangling link is not created through either.
  const std::string dangling = t.path + "/d/secret";
  fs::create_directories(t.path + "/d");
  ::chmod((t.path + "/d").c_str(), 0700);
  ASSERT_EQ(::symlink((t.path + "/nowhere").c_str(), dangling.c_str()), 0);
  EXPECT_THROW(base::load_or_create_secret(dangling), Error);
  EXPECT_FALSE(fs::exists(t.path + "/nowhere"));
}

TEST(SecretFile, AnotherUsersFileOrDirectoryIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a file owned by another uid";
  TempDir t;
  const std::string path = t.path + "/secret";
  write_file(path, "theirs\n", 0600);
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  try {
    base::read_secret_file(path);
    FAIL() << "another user's secret file was used";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("owned by uid 65534"), std::string::npos) << e.what();
  }
  const std::string dir = t.path + "/theirs";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
  EXPECT_THROW(base::load_or_create_secret(dir + "/secret"), InvalidArgument);
}

TEST(SecretFile, ADirectoryOthersCanWriteIsRefused) {
  TempDir t;
  const std::string dir = t.path + "/open";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  try {
    base::load_or_create_secret(dir + "/secret");
    FAIL() << "created a secret in a world-writable directory";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("chmod 700"), std::string::npos) << e.what();
  }
}

TEST(SecretFile, AnEmptyFileIsAnError) {
  TempDir t;
  const std::string path = t.path + "/secret";
  write_file(path, "\n", 0600);
  EXPECT_THROW(base::read_secret_file(path), IoError);
}

// No usable home (unset on a CI machine, read-only, or not a directory):
// the per-host fallback, never "no secret".
TEST(SecretFile, AnUnusableHomeFallsBackToThePerHostPlace) {
  TempDir t;
  const std::string not_a_dir = t.path + "/file";
  write_file(not_a_dir, "x", 0600);
  const std::string fb = base::fallback_secret_path();
  const std::string fb_dir = fs::path(fb).parent_path();
  const bool existed = fs::exists(fb_dir);
  base::UserSecret s = base::user_secret(Environment{{"HOME", not_a_dir}});
  EXPECT_TRUE(s.fallback);
  EXPECT_EQ(s.path, fb);
  EXPECT_TRUE(is_hex64(s.secret));
  EXPECT_EQ(mode_of(fb_dir), 0700u);
  // An explicit PUSHPULL_SECRET_FILE never falls back: its error is the answer.
  EXPECT_THROW(base::user_secret(Environment{{"PUSHPULL_SECRET_FILE", not_a_dir + "/secret"}}),
               Error);
  if (!existed) {
    std::error_code ec;
    fs::remove_all(fb_dir, ec);
  }
}

TEST(SecretFile, FromEnvTakesTheSecretInOrder) {
  TempDir t;
  const std::string path = t.path + "/p/secret";
  // Nothing set: the per-user file, created.
  Options o = Options::from_env(Environment{{"PUSHPULL_SECRET_FILE", path}});
  EXPECT_EQ(o.net.job_secret, base::read_secret_file(path));
  EXPECT_NE(o.net.job_secret_source.find(path), std::string::npos) << o.net.job_secret_source;
  // Empty PUSHPULL_JOB_SECRET no longer turns authentication off.
  o = Options::from_env(Environment{{"PUSHPULL_SECRET_FILE", path}, {"PUSHPULL_JOB_SECRET", ""}});
  EXPECT_EQ(o.net.job_secret, base::read_secret_file(path));
  // An explicit secret wins.
  o = Options::from_env(Environment{{"PUSHPULL_SECRET_FILE", path}, {"PUSHPULL_JOB_SECRET", "x"}});
  EXPECT_EQ(o.net.job_secret, "x");
  EXPECT_EQ(o.net.job_secret_source, "PUSHPULL_JOB_SECRET");
  // PUSHPULL_JOB_SECRET_FILE: read, never created, same checks.
  const std::string given = t.path + "/given";
  write_file(given, "from-file\n", 0600);
  o = Options::from_env(
      Environment{{"PUSHPULL_SECRET_FILE", path}, {"PUSHPULL_JOB_SECRET_FILE", given}});
  EXPECT_EQ(o.net.job_secret, "from-file");
  EXPECT_THROW(Options::from_env(Environment{{"PUSHPULL_JOB_SECRET_FILE", t.path + "/none"}}),
               IoError);
  ::chmod(given.c_str(), 0644);
  EXPECT_THROW(Options::from_env(Environment{{"PUSHPULL_JOB_SECRET_FILE", given}}),
               InvalidArgument);
  // PUSHPULL_ALLOW_INSECURE=1 is the only way to have none; no file is made.
  const std::string unused = t.path + "/q/secret";
  o = Options::from_env(
      Environment{{"PUSHPULL_SECRET_FILE", unused}, {"PUSHPULL_ALLOW_INSECURE", "1"}});
  EXPECT_TRUE(o.net.job_secret.empty());
  EXPECT_FALSE(fs::exists(unused));
}

}  // namespace
}  // namespace pushpull
