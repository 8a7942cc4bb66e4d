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

#include "pushpull/error.h"
#include "transport/socket.h"

namespace pushpull::transport {
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
  Fd client;
  const Status dialed = connect_once(resolve("127.0.0.1", local_port(listener.get())), 2s, &client);
  const std::string error = dialed.message();
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
  Fd client;
  const Status dialed = connect_once(resolve("127.0.0.1", port), 2s, &client);
  const std::string error = dialed.message();
  EXPECT_FALSE(client.valid());
  EXPECT_EQ(dialed.code(), ErrorCode::kIoError);
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
  Fd client;
  const Status dialed = connect_once(resolve("127.0.0.1", port), 2s, &client);
  const std::string error = dialed.message();
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
  Fd out;
  auto adopt = [&](const char* value, int on) {
    Status st = adopt_inherited_listener(value, on, &out);
    why = st.message();
    EXPECT_EQ(st.is_ok(), out.valid()) << st.to_string();
    return st;
  };

  EXPECT_EQ(adopt(nullptr, port).code(), ErrorCode::kNotFound);
  EXPECT_THAT(why, ::testing::HasSubstr("not set"));
  for (const char* bad : {"", "x", "2", "-5", "4x", "99999999999"}) {
    const ErrorCode want = *bad == '\0' ? ErrorCode::kNotFound : ErrorCode::kInvalidArgument;
    EXPECT_EQ(adopt(bad, port).code(), want) << bad;
  }
  EXPECT_EQ(adopt("1000000", port).code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(why, ::testing::HasSubstr("no such open descriptor"));
  EXPECT_EQ(adopt(number.c_str(), port + 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(why, ::testing::HasSubstr("bound to port " + std::to_string(port)));

  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  Fd pipe_r(pipe_fds[0]), pipe_w(pipe_fds[1]);
  const std::string pipe_number = std::to_string(pipe_r.get());
  EXPECT_EQ(adopt(pipe_number.c_str(), 0).code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(why, ::testing::HasSubstr("not a stream socket"));
  EXPECT_GE(fcntl(pipe_r.get(), F_GETFD), 0) << "a refused descriptor must stay open";

  Fd bound_only(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  SockAddr any = resolve("127.0.0.1", 0);
  ASSERT_EQ(::bind(bound_only.get(), reinterpret_cast<sockaddr*>(&any.storage), any.len), 0);
  const std::string bound_number = std::to_string(bound_only.get());
  EXPECT_EQ(adopt(bound_number.c_str(), 0).code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(why, ::testing::HasSubstr("not a listening socket"));

  ASSERT_TRUE(adopt(number.c_str(), port).is_ok()) << why;
  Fd adopted = std::move(out);
  listener.release();  // the same descriptor, owned by `adopted` now
  EXPECT_EQ(local_port(adopted.get()), port);
  EXPECT_TRUE(fcntl(adopted.get(), F_GETFD) & FD_CLOEXEC);
  EXPECT_TRUE(fcntl(adopted.get(), F_GETFL) & O_NONBLOCK);
  Fd client;
  const Status dialed = connect_once(resolve("127.0.0.1", port), 2s, &client);
  const std::string error = dialed.message();
  EXPECT_TRUE(client.valid()) << error;
}

// PUSHPULL_LISTEN_FD (NetOptions::inherited_listener) is taken once per process: a second caller (a
// second rendezvous, after the first closed the socket and its number was reused) never adopts a
// descriptor it does not own.
TEST(Socket, TheInheritedListenerIsTakenOnce) {
  Fd listener = listen_on("127.0.0.1", 0);
  const int port = local_port(listener.get());
  const std::string number = std::to_string(listener.get());
  Fd taken;
  EXPECT_EQ(take_inherited_listener(port + 1, number, &taken).code(), ErrorCode::kInvalidArgument)
      << "the wrong port";
  EXPECT_FALSE(taken.valid());
  Status st = take_inherited_listener(port, number, &taken);
  ASSERT_TRUE(st.is_ok() && taken.valid()) << st.to_string();
  listener.release();
  Fd again;
  st = take_inherited_listener(port, number, &again);
  EXPECT_FALSE(again.valid());
  EXPECT_EQ(st.code(), ErrorCode::kNotFound);
  EXPECT_THAT(st.message(), ::testing::HasSubstr("taken already"));
}

}  // namespace
}  // namespace pushpull::transport
