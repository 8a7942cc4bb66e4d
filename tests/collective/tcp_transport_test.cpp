// SPDX-License-Identifier: Apache-2.0
// The collective engine over real TCP on loopback (src/transport/tcp), ranks as
// threads: data ops against local references, and a closed rank turning
// into PeerFailure on the others.
#include "transport/tcp/tcp_transport.h"

#include <gtest/gtest.h>

#include <thread>

#include "harness.h"
#include "pushpull/collective.h"
#include "tcp_group.h"
#include "transport/socket.h"

namespace pushpull::collective {

using transport::TcpTransport;

namespace {

using testing::make_input;
using testing::reference;

std::vector<std::unique_ptr<TcpTransport>> connect_group(int n) {
  return testing::connect_tcp_group(n);
}

void run_comms(int n, const std::function<void(int, Communicator&)>& fn) {
  auto ts = connect_group(n);
  CommunicatorOptions o;
  o.peer_timeout = Millis(5000);
  o.wait_timeout = Millis(20000);
  std::vector<std::unique_ptr<Communicator>> cs;
  for (int r = 0; r < n; ++r)
    cs.push_back(std::make_unique<Communicator>(std::move(ts[r]), o));
  testing::on_threads(n, [&](int r) { fn(r, *cs[r]); });
}

TEST(TcpTransport, CollectivesOverLoopback) {
  for (int n : {2, 3, 4}) {
    run_comms(n, [&](int r, Communicator& c) {
      for (int64_t count : {int64_t{1}, int64_t{1001}, int64_t{(3 << 20) / 4 + 1}}) {
        Array a = make_input(ReduceOp::kSum, DType::kFloat32, r, count);
        c.allreduce(fmt::format("a{}", count), a);
        for (int64_t i = 0; i < count; i += 7)
          ASSERT_EQ(get_element(a, i), reference(ReduceOp::kSum, DType::kFloat32, n, i));
      }
      std::vector<int32_t> b(100000, r == 1 ? 7 : 0);
      c.broadcast("b", ArrayView(b.data(), Shape{100000}), 1);
      for (int32_t v : b)
        ASSERT_EQ(v, 7);
      Array mine = Array::full(Shape{r + 1, 3}, r, DType::kInt64);
      Array all = c.allgather("g", mine);
      ASSERT_EQ(all.shape()[0], n * (n + 1) / 2);
      int64_t row = 0;
      for (int q = 0; q < n; ++q)
        for (int k = 0; k <= q; ++k, ++row)
          ASSERT_EQ(get_element(all, row * 3 + 2), q);
      c.barrier();
    });
  }
}

// An elastic member binds its mesh listener before it joins (the round's book
// names the port first): the transport takes over that socket, listening on
// the very port published, and the mesh forms on it.
TEST(TcpTransport, ListensOnASocketBoundBeforeIt) {
  const int n = 3;
  NetOptions net;
  net.connect_timeout = Millis(5000);
  std::vector<transport::Fd> listeners;
  std::vector<std::pair<std::string, int>> book;
  for (int r = 0; r < n; ++r) {
    listeners.push_back(transport::listen_on("127.0.0.1", 0));
    book.emplace_back("127.0.0.1", transport::local_port(listeners.back().get()));
  }
  std::vector<std::unique_ptr<TcpTransport>> ts;
  for (int r = 0; r < n; ++r) {
    ts.push_back(std::make_unique<TcpTransport>(r, n, net, "127.0.0.1", std::move(listeners[r])));
    EXPECT_EQ(ts.back()->port(), book[r].second);
  }
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] { ts[r]->connect_all(book); });
  for (auto& t : th)
    t.join();
  CommunicatorOptions o;
  o.peer_timeout = Millis(5000);
  o.wait_timeout = Millis(20000);
  std::vector<std::unique_ptr<Communicator>> cs;
  for (int r = 0; r < n; ++r)
    cs.push_back(std::make_unique<Communicator>(std::move(ts[r]), o));
  th.clear();
  std::vector<int64_t> sums(n, -1);
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      Array a = Array::full(Shape{4}, r + 1, DType::kInt64);
      cs[r]->allreduce("held", a);
      sums[r] = static_cast<int64_t>(get_element(a, 3));
    });
  for (auto& t : th)
    t.join();
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(sums[r], 6) << "rank " << r;
}

TEST(TcpTransport, ClosedRankFailsOthers) {
  run_comms(3, [&](int r, Communicator& c) {
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      c.shutdown();
      return;
    }
    Array a = Array::full(Shape{10}, 1.0);
    auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(c.allreduce("x", a), PeerFailure);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  });
}

}  // namespace
}  // namespace pushpull::collective
