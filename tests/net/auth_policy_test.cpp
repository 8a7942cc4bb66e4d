// SPDX-License-Identifier: Apache-2.0
// Secure by default at the net layer: the no-secret peer policy and its
// options, bind addresses, held hellos, a large message's buffer, the
// rate-limited refusal log, and accept() running out of descriptors.
// Authentication and strangers: auth_test.cpp.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <future>
#include <thread>

#include "fixture.h"
#include "support/wait.h"
#include "transport/node_id.h"
#include "transport/peer_policy.h"

namespace pushpull::transport {
namespace {

using namespace std::chrono_literals;
using test::config;
using test::Sink;
using test::wait_until;

using test::kData;

TEST(Auth, WithoutASecretOnlyThisMachineMayConnect) {
  NetOptions open;
  EXPECT_TRUE(peer_refusal(resolve("127.0.0.1", 1), open).is_ok());
  EXPECT_TRUE(peer_refusal(resolve("127.4.5.6", 1), open).is_ok());
  EXPECT_TRUE(peer_refusal(resolve("::1", 1), open).is_ok());
  EXPECT_TRUE(peer_refusal(resolve("::ffff:127.0.0.1", 1), open).is_ok());
  const Status refused = peer_refusal(resolve("10.1.2.3", 1), open);
  EXPECT_EQ(refused.code(), ErrorCode::kProtocolError);
  const std::string& why = refused.message();
  EXPECT_NE(why.find("PUSHPULL_JOB_SECRET"), std::string::npos) << why;
  EXPECT_NE(why.find("10.1.2.3"), std::string::npos) << why;
  EXPECT_FALSE(peer_refusal(resolve("fd00::7", 1), open).is_ok());
  EXPECT_TRUE(peer_refusal(resolve("10.1.2.3", 1), open, {"10.1.2.3"}).is_ok());  // our own
  EXPECT_TRUE(peer_refusal(resolve("::ffff:10.1.2.3", 1), open, {"10.1.2.3"}).is_ok());
  NetOptions secret;
  secret.job_secret = "s";
  EXPECT_TRUE(peer_refusal(resolve("10.1.2.3", 1), secret).is_ok());
  NetOptions insecure;
  insecure.allow_insecure = true;
  EXPECT_TRUE(peer_refusal(resolve("10.1.2.3", 1), insecure).is_ok());
  EXPECT_TRUE(is_loopback(resolve("127.0.0.1", 1)));
  EXPECT_FALSE(is_loopback(resolve("128.0.0.1", 1)));
}

TEST(Auth, PolicyOptionsComeFromTheEnvironment) {
  Environment env(std::map<std::string, std::string>{{"PUSHPULL_ALLOW_INSECURE", "1"},
                                                     {"PUSHPULL_BIND_ANY", "true"},
                                                     {"PUSHPULL_HANDSHAKE_TIMEOUT_MS", "250"}});
  Options o = Options::from_env(env);
  EXPECT_TRUE(o.net.allow_insecure);
  EXPECT_TRUE(o.net.bind_any);
  EXPECT_EQ(o.net.handshake_timeout, Millis(250));
  Options d = Options::from_env(Environment());
  EXPECT_FALSE(d.net.allow_insecure);
  EXPECT_FALSE(d.net.bind_any);
  EXPECT_THROW(Options::from_env(Environment(
                   std::map<std::string, std::string>{{"PUSHPULL_ALLOW_INSECURE", "maybe"}})),
               InvalidArgument);
}

TEST(Auth, BindWhereAdvertised) {
  EXPECT_EQ(bind_host_for("127.0.0.1", false), "127.0.0.1");
  EXPECT_EQ(bind_host_for("127.0.1.1", false), "127.0.1.1");
  EXPECT_EQ(bind_host_for("localhost", false), "127.0.0.1");
  EXPECT_EQ(bind_host_for("::1", false), "::1");
  EXPECT_EQ(bind_host_for("10.0.0.5", false), "10.0.0.5");
  EXPECT_EQ(bind_host_for("fd00::5", false), "fd00::5");
  EXPECT_EQ(bind_host_for("10.0.0.5", true), "");
  EXPECT_EQ(bind_host_for("fd00::5", true), "::");
  EXPECT_EQ(bind_host_for("", false), "");
  EXPECT_EQ(bind_host_for("0.0.0.0", false), "");
  EXPECT_EQ(bind_host_for("::", false), "::");
}

TEST(Auth, AnUnrankedNodeHoldsHellosUntilItHasARank) {
  auto cfg = config(Role::kWorker, -1, "s3cret");
  cfg.hold_hellos_until_ranked = true;
  MessageTransport a(cfg);
  a.listen("127.0.0.1", 0);
  a.start();
  MessageTransport b(config(Role::kWorker, 1, "s3cret"));
  b.start();
  auto fut = std::async(std::launch::async, [&] { return b.connect("127.0.0.1", a.port()); });
  EXPECT_EQ(fut.wait_for(300ms), std::future_status::timeout);
  a.set_identity(Role::kWorker, 0, node_id(Role::kWorker, 0));
  ASSERT_EQ(fut.wait_for(5s), std::future_status::ready);
  auto p = b.peer(fut.get());
  ASSERT_TRUE(p);
  EXPECT_EQ(p->rank, 0);
}

TEST(Auth, ALargeMessageGrowsItsBufferAsBytesArrive) {
  Sink a(config(Role::kServer, 0, "s3cret"));
  MessageTransport b(config(Role::kWorker, 0, "s3cret"));
  b.start();
  ConnId c = b.connect("127.0.0.1", a.t.port());
  std::vector<uint8_t> big((5 << 20) + 13);
  for (size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<uint8_t>(i * 7 + 3);
  b.send(c, Header{.type = kData}, big.data(), big.size(), nullptr);
  ASSERT_TRUE(wait_until([&] { return a.count() == 1; }));
  std::lock_guard l(a.mu);
  ASSERT_EQ(a.got[0].payload.size(), big.size());
  EXPECT_EQ(std::memcmp(a.got[0].payload.data(), big.data(), big.size()), 0);
}

TEST(Auth, RefusalLogIsRateLimitedPerAddress) {
  std::fflush(stderr);
  char path[] = "/tmp/pushpull_refusal_logXXXXXX";
  int file = mkstemp(path);
  ASSERT_GE(file, 0);
  int saved = dup(2);
  dup2(file, 2);
  {
    RefusalLog log(10s);
    for (int i = 0; i < 1000; ++i)
      log.note("10.0.0.1", "refused a stranger");
    log.note("10.0.0.2", "refused another");
  }
  dup2(saved, 2);
  ::close(saved);
  ::close(file);
  std::ifstream in(path);
  int lines = 0;
  for (std::string line; std::getline(in, line);)
    ++lines;
  std::remove(path);
  EXPECT_EQ(lines, 2);
}

// Open descriptors of this process.
int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr)
      ++n;
    closedir(d);
  }
  return n;
}

// The child of AcceptPausesWhenOutOfDescriptors; returns its exit code.
int out_of_descriptors_child(const std::string& log_path) {
  FILE* log = std::freopen(log_path.c_str(), "w", stderr);
  if (log == nullptr) return 10;
  MessageTransport a(config(Role::kServer, 0, "s3cret"));
  a.listen("127.0.0.1", 0);
  a.start();
  MessageTransport b(config(Role::kWorker, 0, "s3cret"));
  b.start();
  // One connection first, with descriptors to spare: besides showing the
  // pair works, it lets UBSan's vptr check (sanitizer builds) learn the
  // types of a connection's shared state. A type it first meets while the
  // process has no descriptor left looks like an invalid object to it (its
  // memory probe needs a pipe) and ends the child.
  try {
    MessageTransport warm(config(Role::kWorker, 1, "s3cret"));
    warm.start();
    warm.connect("127.0.0.1", a.port(), 5s);
  } catch (const std::exception&) {
    return 17;
  }
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  rlimit low = lim;
  low.rlim_cur = static_cast<rlim_t>(open_fds() + 40);
  if (setrlimit(RLIMIT_NOFILE, &low) != 0) return 11;
  SockAddr addr = resolve("127.0.0.1", a.port());
  std::vector<int> clients;
  for (int i = 0; i < 200; ++i) {
    int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) break;
    clients.push_back(s);
    if (::connect(s, reinterpret_cast<sockaddr*>(&addr.storage), addr.len) != 0) break;
  }
  std::this_thread::sleep_for(200ms);
  timespec t0{}, t1{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
  std::this_thread::sleep_for(1s);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
  double cpu = static_cast<double>(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
  for (int s : clients)
    ::close(s);  // frees descriptors (and lets us read the log)
  std::fflush(stderr);
  int lines = 0;
  {
    std::ifstream in(log_path);
    for (std::string line; std::getline(in, line);)
      lines += line.find("cannot accept") != std::string::npos;
  }
  if (lines == 0) return 12;  // never ran out: the test did not test anything
  if (cpu > 0.3) return 13;
  if (lines > 5) return 14;
  try {
    ConnId c = b.connect("127.0.0.1", a.port(), 5s);
    if (!b.peer(c)) return 15;
  } catch (const std::exception&) {
    return 16;
  }
  return 0;
}

TEST(Auth, AcceptPausesWhenOutOfDescriptors) {
  char path[] = "/tmp/pushpull_emfile_logXXXXXX";
  int file = mkstemp(path);
  ASSERT_GE(file, 0);
  ::close(file);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(out_of_descriptors_child(path));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  std::ifstream in(path);
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  ASSERT_TRUE(WIFEXITED(status)) << log;
  // 12: never hit EMFILE, 13: spun (CPU), 14: logged too much, 15/16: no recovery,
  // 17: no connection before the descriptors ran out.
  EXPECT_EQ(WEXITSTATUS(status), 0) << log.substr(0, 4000);
}

}  // namespace
}  // namespace pushpull::transport
