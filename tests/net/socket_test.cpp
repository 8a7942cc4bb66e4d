// SPDX-License-Identifier: Apache-2.0
// The socket helpers a rendezvous depends on: a port handed out for another
// process to bind (racy, for torch's store), a listener bound first and
// handed down (PUSHPULL_LISTEN_FD), a taken port named as such, and a
// connect that met itself instead of a listener.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "net/socket.h"
#include "pushpull/error.h"

namespace pushpull::net {
namespace {

using namespace std::chrono_literals;

int ephemeral_low() {
  int lo = 32768, hi = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    std::fclose(f);
  }
  return lo;
}

// A picked port (racy: only for listeners pushpull cannot hand a socket to,
// e.g. a torch store's MASTER_PORT or worker 0 started by ssh) is bound
// later by another process; a port below the ephemeral range cannot
// meanwhile become some connect()'s source port (which is how a rank once
// connected to itself on the rendezvous port).
TEST(Socket, AnUnusedPortIsBelowTheEphemeralRangeAndCanBeBound) {
  for (int i = 0; i < 20; ++i) {
    const int port = pick_unused_port("127.0.0.1");
    if (ephemeral_low() > 11000) {
      EXPECT_LT(port, ephemeral_low());
    }
    EXPECT_GT(port, 0);
    Fd listener = listen_on("127.0.0.1", port);  // throws if it was taken
    EXPECT_EQ(local_port(listener.get()), port);
  }
}

// TCP's simultaneous open: a socket bound to a port and connected to that same
// address is connected to itself. connect_once must never hand such a socket
// out as a connection to a listener; is_self_connection tells them apart.
TEST(Socket, ASocketConnectedToItselfIsRecognised) {
  const int port = pick_unused_port("127.0.0.1");
  SockAddr addr = resolve("127.0.0.1", port);
  Fd self(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(self.valid());
  ASSERT_EQ(::bind(self.get(), reinterpret_cast<sockaddr*>(&addr.storage), addr.len), 0);
  ASSERT_EQ(::connect(self.get(), reinterpret_cast<sockaddr*>(&addr.storage), addr.len), 0);
  EXPECT_TRUE(is_self_connection(self.get()));

  Fd listener = listen_on("127.0.0.1", 0);
  std::string error;
  Fd client = connect_once(resolve("127.0.0.1", local_port(listener.get())), 2s, &error);
  ASSERT_TRUE(client.valid()) << error;
  EXPECT_FALSE(is_self_connection(client.get()));
}

// A port another socket holds: the error says so, naming the port.
TEST(Socket, ListeningOnATakenPortSaysItIsInUse) {
  Fd squatter = listen_on("127.0.0.1", 0);
  const int port = local_port(squatter.get());
  try {
    Fd mine = listen_on("127.0.0.1", port);
    FAIL() << "bound a port another socket listens on";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("port " + std::to_string(port) +
                                               " is in use (by another process)"));
  }
}

// A reserved port: nobody else can bind it (even with SO_REUSEADDR, as a
// listener does), and a connection to it is refused rather than left hanging.
TEST(Socket, AReservedPortCannotBeBoundAndRefusesConnections) {
  Fd reserved = reserve_port("127.0.0.1", 0);
  const int port = local_port(reserved.get());
  ASSERT_GT(port, 0);
  EXPECT_THROW(listen_on("127.0.0.1", port), IoError);
  EXPECT_THROW(reserve_port("127.0.0.1", port), IoError);
  std::string error;
  Fd client = connect_once(resolve("127.0.0.1", port), 2s, &error);
  EXPECT_FALSE(client.valid());
  EXPECT_THAT(error, ::testing::HasSubstr("refused"));
}

// A shared reservation (MASTER_PORT, held for torch's store): a bind without
// SO_REUSEADDR fails on every address of the port, a listener that sets
// SO_REUSEADDR (as torch's TCPStore does) binds and serves beside it.
TEST(Socket, ASharedReservationLetsOnlyAReuseAddrListenerBindThePort) {
  Fd held = reserve_port_shared("", 0);
  const int port = local_port(held.get());
  ASSERT_GT(port, 0);
  EXPECT_THROW(reserve_port("127.0.0.1", port), IoError);
  EXPECT_THROW(reserve_port("", port), IoError);
  EXPECT_THROW(reserve_port("::1", port), IoError);  // IPv6 only, where there is IPv6
  Fd store = listen_on("", port);                    // SO_REUSEADDR, the wildcard: as torch's store
  std::string error;
  Fd client = connect_once(resolve("127.0.0.1", port), 2s, &error);
  EXPECT_TRUE(client.valid()) << error;
  // Once the store listens, nobody else binds the port, SO_REUSEADDR or not.
  EXPECT_THROW(listen_on("127.0.0.1", port), IoError);
}

// A listener handed down by the launcher is adopted when it is what it claims
// to be (a listening TCP socket on the expected port), close-on-exec and
// non-blocking; anything else is left alone (not ours to close) and says why.
TEST(Socket, AnInheritedListenerIsAdoptedOnlyWhenItListensOnThePort) {
  Fd listener = listen_on("127.0.0.1", 0);
  const int port = local_port(listener.get());
  // As the launcher leaves it for the child: inheritable, blocking.
  ASSERT_EQ(fcntl(listener.get(), F_SETFD, 0), 0);
  set_nonblocking(listener.get(), false);
  const std::string number = std::to_string(listener.get());
  std::string why;

  EXPECT_FALSE(adopt_inherited_listener(nullptr, port, &why).valid());
  EXPECT_THAT(why, ::testing::HasSubstr("not set"));
  for (const char* bad : {"", "x", "2", "-5", "4x", "99999999999"}) {
    EXPECT_FALSE(adopt_inherited_listener(bad, port, &why).valid()) << bad;
  }
  EXPECT_FALSE(adopt_inherited_listener("1000000", port, &why).valid());
  EXPECT_THAT(why, ::testing::HasSubstr("no such open descriptor"));
  EXPECT_FALSE(adopt_inherited_listener(number.c_str(), port + 1, &why).valid());
  EXPECT_THAT(why, ::testing::HasSubstr("bound to port " + std::to_string(port)));

  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  Fd pipe_r(pipe_fds[0]), pipe_w(pipe_fds[1]);
  const std::string pipe_number = std::to_string(pipe_r.get());
  EXPECT_FALSE(adopt_inherited_listener(pipe_number.c_str(), 0, &why).valid());
  EXPECT_THAT(why, ::testing::HasSubstr("not a stream socket"));
  EXPECT_GE(fcntl(pipe_r.get(), F_GETFD), 0) << "a refused descriptor must stay open";

  Fd bound_only(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  SockAddr any = resolve("127.0.0.1", 0);
  ASSERT_EQ(::bind(bound_only.get(), reinterpret_cast<sockaddr*>(&any.storage), any.len), 0);
  const std::string bound_number = std::to_string(bound_only.get());
  EXPECT_FALSE(adopt_inherited_listener(bound_number.c_str(), 0, &why).valid());
  EXPECT_THAT(why, ::testing::HasSubstr("not a listening socket"));

  Fd adopted = adopt_inherited_listener(number.c_str(), port, &why);
  ASSERT_TRUE(adopted.valid()) << why;
  listener.release();  // the same descriptor, owned by `adopted` now
  EXPECT_EQ(local_port(adopted.get()), port);
  EXPECT_TRUE(fcntl(adopted.get(), F_GETFD) & FD_CLOEXEC);
  EXPECT_TRUE(fcntl(adopted.get(), F_GETFL) & O_NONBLOCK);
  std::string error;
  Fd client = connect_once(resolve("127.0.0.1", port), 2s, &error);
  EXPECT_TRUE(client.valid()) << error;
}

// PUSHPULL_LISTEN_FD (NetOptions::inherited_listener) is taken once per process: a second caller (a
// second rendezvous, after the first closed the socket and its number was reused) never adopts a
// descriptor it does not own.
TEST(Socket, TheInheritedListenerIsTakenOnce) {
  Fd listener = listen_on("127.0.0.1", 0);
  const int port = local_port(listener.get());
  const std::string number = std::to_string(listener.get());
  std::string why;
  EXPECT_FALSE(take_inherited_listener(port + 1, number, &why).valid()) << "the wrong port";
  Fd taken = take_inherited_listener(port, number, &why);
  ASSERT_TRUE(taken.valid()) << why;
  listener.release();
  EXPECT_FALSE(take_inherited_listener(port, number, &why).valid());
  EXPECT_THAT(why, ::testing::HasSubstr("taken already"));
}

// A listener offered in-process (the torch ProcessGroup's rank 0) goes to
// the rendezvous of its port only, once; withdrawn, nobody gets it.
TEST(Socket, AnOfferedListenerGoesToItsPortOnce) {
  Fd listener = listen_on("127.0.0.1", 0);
  const int port = local_port(listener.get());
  const int fd = listener.get();
  offer_listener(std::move(listener));
  EXPECT_FALSE(take_inherited_listener(port + 1, "").valid()) << "another port's rendezvous";
  Fd taken = take_inherited_listener(port, "");
  ASSERT_TRUE(taken.valid());
  EXPECT_EQ(taken.get(), fd);
  EXPECT_FALSE(take_inherited_listener(port, "").valid());

  offer_listener(listen_on("127.0.0.1", 0));
  withdraw_offered_listener();
  EXPECT_FALSE(take_inherited_listener(0, "").valid());
}

}  // namespace
}  // namespace pushpull::net
