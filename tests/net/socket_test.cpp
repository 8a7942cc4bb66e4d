// SPDX-License-Identifier: Apache-2.0
// The socket helpers a rendezvous depends on: a port handed out for another
// process to bind, and a connect that met itself instead of a listener.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "net/socket.h"

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

// The launcher hands the port to worker 0, which binds it later; a port below
// the ephemeral range cannot meanwhile become some connect()'s source port
// (which is how a rank once connected to itself on the rendezvous port).
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

}  // namespace
}  // namespace pushpull::net
