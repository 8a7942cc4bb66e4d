// SPDX-License-Identifier: Apache-2.0
// Which secret a launched job gets (launch::resolve_launch_secret): the
// user's, a file's, none only with PUSHPULL_ALLOW_INSECURE=1, the per-user
// file in the per-node mode (every node's launcher must agree), else a fresh
// one. An empty PUSHPULL_JOB_SECRET no longer turns authentication off.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/secret_file.h"
#include "launch/launcher.h"
#include "pushpull/error.h"

namespace pushpull::launch {
namespace {

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/pp-launch-secret.XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

TEST(LaunchSecret, GivenWinsThenFileThenFresh) {
  TempDir t;
  LaunchConfig cfg;
  Environment env{{"PUSHPULL_SECRET_FILE", t.path + "/u/secret"}};
  EXPECT_EQ(resolve_launch_secret(cfg, env, std::string("mine")), "mine");
  // Unset or empty: a fresh one per job, 128 bits in hex.
  std::string a = resolve_launch_secret(cfg, env, std::nullopt);
  std::string b = resolve_launch_secret(cfg, env, std::string());
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(b.size(), 32u);
  EXPECT_NE(a, b);
  EXPECT_FALSE(std::filesystem::exists(t.path + "/u/secret"));  // not needed: not made
  // PUSHPULL_JOB_SECRET_FILE.
  const std::string f = t.path + "/given";
  std::ofstream(f) << "from-file\n";
  ::chmod(f.c_str(), 0600);
  env.set("PUSHPULL_JOB_SECRET_FILE", f);
  EXPECT_EQ(resolve_launch_secret(cfg, env, std::nullopt), "from-file");
  ::chmod(f.c_str(), 0644);
  EXPECT_THROW(resolve_launch_secret(cfg, env, std::nullopt), InvalidArgument);
}

TEST(LaunchSecret, NoSecretOnlyWhenAskedForAndAllowed) {
  LaunchConfig cfg;
  Environment env;
  EXPECT_FALSE(resolve_launch_secret(cfg, env, std::string()).empty());
  cfg.allow_insecure = true;
  EXPECT_TRUE(resolve_launch_secret(cfg, env, std::string()).empty());
  EXPECT_FALSE(resolve_launch_secret(cfg, env, std::nullopt).empty());  // unset: still made
}

TEST(LaunchSecret, PerNodeModeUsesThePerUserFile) {
  TempDir t;
  LaunchConfig cfg;
  cfg.nnodes = 2;
  Environment env{{"PUSHPULL_SECRET_FILE", t.path + "/u/secret"}};
  const std::string s = resolve_launch_secret(cfg, env, std::nullopt);
  EXPECT_EQ(s, base::read_secret_file(t.path + "/u/secret"));
  // Another node sharing the home reads the same.
  EXPECT_EQ(resolve_launch_secret(cfg, env, std::string()), s);
  cfg.allow_insecure = true;
  EXPECT_TRUE(resolve_launch_secret(cfg, env, std::nullopt).empty());
}

}  // namespace
}  // namespace pushpull::launch
