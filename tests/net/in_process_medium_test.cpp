// SPDX-License-Identifier: Apache-2.0
// The in-process medium's own rules (transport/inproc/in_process_listeners.h):
// a listener holds no socket, a number is one listener's, stop() takes it
// back. What runs over the medium (hello, refusals, framing, streams, TLS,
// garbage) is tested by the MessageTransport suites, each over every medium.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "fixture.h"
#include "support/wait.h"
#include "transport/inproc/in_process_listeners.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::transport {
namespace {

using namespace std::chrono_literals;
using test::config;
using test::kData;
using test::Sink;

// Open sockets of this process (/proc/self/fd links "socket:[inode]").
int open_sockets() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string().rfind("socket:", 0) == 0) ++n;
  }
  return n;
}

TEST(InProcessMedium, AListenerHoldsNoSocketAndAConnectionIsOnePair) {
  const int before = open_sockets();
  Sink a(config(Role::kServer, 0), "inproc");
  EXPECT_EQ(open_sockets(), before);  // nothing anyone else could reach
  MessageTransport b(config(Role::kWorker, 1));
  b.start();
  ConnId c = b.connect("inproc", a.t.port());
  ASSERT_TRUE(b.send_copy(c, Header{.type = kData}, "hi", 2).is_ok());
  ASSERT_TRUE(test::wait_until([&] { return a.count() == 1; }));
  EXPECT_EQ(open_sockets(), before + 2);  // the socketpair's two ends
  EXPECT_EQ(b.peer(c)->address, "inproc");
  std::lock_guard l(a.mu);
  EXPECT_EQ(a.peers.at(0).second.address, "inproc");
  EXPECT_EQ(a.peers.at(0).second.rank, 1);
}

TEST(InProcessMedium, ANumberIsOneListenersUntilItStops) {
  auto a = std::make_unique<Sink>(config(Role::kServer, 0), "inproc");
  const int port = a->t.port();
  EXPECT_GT(port, 0);
  MessageTransport other(config(Role::kServer, 1));
  EXPECT_THROW(other.listen("inproc", port), IoError);
  a.reset();  // stop() gives the number back; nobody answers there now
  MessageTransport b(config(Role::kWorker, 0));
  b.start();
  try {
    b.connect("inproc", port, 300ms);
    FAIL() << "connected to a stopped listener";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("no transport of this process listens on inproc:" +
                                         std::to_string(port)),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(other.listen("inproc", port), port);
}

// No code path may turn "inproc" into a real socket: an AF_UNIX bind of the
// unnamed address would autobind an abstract-namespace socket any local user
// can reach.
TEST(InProcessMedium, BindingTheMediumIsRefused) {
  const int before = open_sockets();
  EXPECT_THROW(listen_on("inproc", 0), InvalidArgument);
  EXPECT_THROW(reserve_port("inproc", 0), InvalidArgument);
  EXPECT_EQ(open_sockets(), before);
}

// Numbers travel as TCP ports in address books: they stay in 1..65535,
// wrapping past the last and skipping those in use.
TEST(InProcessMedium, NumbersStayWithinATcpPortsRange) {
  std::vector<int> taken;
  for (;;) {
    int p = 0;
    try {
      p = in_process::add(0, [](Fd) {});
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("no free in-process port"), std::string::npos);
      break;
    }
    ASSERT_GE(p, 1);
    ASSERT_LE(p, 65535);
    taken.push_back(p);
    ASSERT_LE(taken.size(), 65535u);
  }
  EXPECT_EQ(taken.size(), 65535u);
  EXPECT_THROW(in_process::add(70000, [](Fd) {}), InvalidArgument);
  in_process::remove(taken[100]);
  EXPECT_EQ(in_process::add(0, [](Fd) {}), taken[100]);
  for (int p : taken)
    in_process::remove(p);
}

TEST(InProcessMedium, ResolvedAddressesNameTheMedium) {
  SockAddr a = resolve("inproc", 7);
  EXPECT_EQ(a.family(), AF_UNIX);
  EXPECT_EQ(a.port(), 7);
  EXPECT_EQ(a.to_string(), "inproc:7");
  Fd fd;
  EXPECT_EQ(connect_once(resolve("inproc", 1 << 30), 100ms, &fd).code(), ErrorCode::kIoError);
  EXPECT_FALSE(fd.valid());
}

}  // namespace
}  // namespace pushpull::transport
