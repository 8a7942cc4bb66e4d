// SPDX-License-Identifier: Apache-2.0
// A scheduler + 2 servers + 3 workers as threads of this process.
#include <gtest/gtest.h>

#include <atomic>
#include <set>

#include "cluster/node.h"
#include "cluster/scheduler.h"
#include "support/cluster_harness.h"
#include "support/media.h"
#include "support/wait.h"

namespace pushpull::cluster {
namespace {

using namespace std::chrono_literals;
using test::InProcessCluster;

// Every test but the socket-buffer ones runs over each medium.
class ClusterOn : public test::Medium {
 protected:
  InProcessCluster::Config on_medium() const {
    InProcessCluster::Config c;
    c.host = host();
    return c;
  }
};
INSTANTIATE_TEST_SUITE_P(Media, ClusterOn, ::testing::ValuesIn(test::kMedia), test::medium_name);

TEST_P(ClusterOn, RegistrationGivesRanksAndTheAddressBook) {
  InProcessCluster c(on_medium());
  std::set<int> ports;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(c.server(r).rank(), r);
    EXPECT_EQ(c.server(r).role(), Role::kServer);
  }
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(c.worker(r).rank(), r);
  for (auto* n : c.nodes()) {
    const AddressBook& b = n->address_book();
    ASSERT_EQ(b.servers.size(), 2u);
    ASSERT_EQ(b.workers.size(), 3u);
    EXPECT_EQ(b.scheduler.port, c.scheduler_port());
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(b.workers[r].rank, r);
      EXPECT_EQ(b.workers[r].host, host());
      EXPECT_EQ(b.workers[r].port, c.worker(r).transport().port());
      ports.insert(b.workers[r].port);
    }
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(b.servers[r].port, c.server(r).transport().port());
  }
  EXPECT_EQ(ports.size(), 3u);
  // Ranks follow (host, port) order when nobody asked for one.
  EXPECT_LT(c.worker(0).transport().port(), c.worker(1).transport().port());
  EXPECT_LT(c.worker(1).transport().port(), c.worker(2).transport().port());
  EXPECT_TRUE(c.shutdown().is_ok());
}

TEST_P(ClusterOn, PreferredRanksAreHonouredWhenEveryNodeHasOne) {
  Options o;
  o.net.node_host = host();
  o.cluster.root_uri = host();
  o.cluster.root_port = 0;
  o.cluster.num_servers = 0;
  o.cluster.num_workers = 3;
  o.cluster.heartbeat_interval = 100ms;
  o.cluster.heartbeat_timeout = 2000ms;
  Scheduler s(o);
  o.cluster.root_port = s.bind();
  auto result = std::async(std::launch::async, [&] { return s.run(); });
  std::vector<std::unique_ptr<Node>> nodes;
  for (int want : {2, 0, 1}) {
    Options no = o;
    no.cluster.role = Role::kWorker;
    no.cluster.preferred_rank = want;
    nodes.push_back(std::make_unique<Node>(no));
  }
  std::vector<std::future<void>> fs;
  for (auto& n : nodes)
    fs.push_back(std::async(std::launch::async, [&n] { n->start(); }));
  for (auto& f : fs)
    f.get();
  EXPECT_EQ(nodes[0]->rank(), 2);
  EXPECT_EQ(nodes[1]->rank(), 0);
  EXPECT_EQ(nodes[2]->rank(), 1);
  fs.clear();
  for (auto& n : nodes)
    fs.push_back(std::async(std::launch::async, [&n] { n->shutdown(); }));
  for (auto& f : fs)
    f.get();
  EXPECT_TRUE(result.get().is_ok());
}

TEST_P(ClusterOn, BarriersOfEachGroupWaitForTheirMembers) {
  InProcessCluster c(on_medium());
  std::atomic<int> before{0};
  std::atomic<bool> early{false};
  c.parallel([&](Node& n) {
    for (int round = 0; round < 5; ++round) {
      ++before;
      n.barrier(Group::kAll, 20s);
      if (before.load() < 5 * (round + 1)) early = true;
      n.barrier(Group::kAll, 20s);
      if (n.role() == Role::kWorker) n.barrier(Group::kWorkers, 20s);
      if (n.role() == Role::kServer) n.barrier(Group::kServers, 20s);
    }
  });
  EXPECT_FALSE(early);
  // A barrier that not every member joins times out, naming itself.
  try {
    c.worker(0).barrier(Group::kWorkers, 300ms);
    FAIL();
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("barrier of workers"), std::string::npos);
  }
}

TEST_P(ClusterOn, NodesMessageEachOtherByRoleAndRank) {
  constexpr uint16_t kPing = 200;
  std::mutex mu;
  std::vector<std::pair<uint32_t, uint32_t>> seen;  // (receiver id, sender id)
  InProcessCluster::Config cfg = on_medium();
  cfg.setup = [&](Node& n) {
    n.set_handler(kPing, kPing, [&mu, &seen, &n](transport::Message&& m) {
      std::lock_guard l(mu);
      seen.emplace_back(n.id(), m.header.sender);
    });
  };
  InProcessCluster c(cfg);
  for (int w = 0; w < 3; ++w) {
    for (int s = 0; s < 2; ++s)
      ASSERT_TRUE(c.worker(w).send_copy(Role::kServer, s, {.type = kPing}, nullptr, 0).is_ok());
    for (int o = 0; o < 3; ++o)
      if (o != w) {
        ASSERT_TRUE(c.worker(w).send_copy(Role::kWorker, o, {.type = kPing}, nullptr, 0).is_ok());
      }
  }
  for (int s = 0; s < 2; ++s)
    for (int w = 0; w < 3; ++w)
      ASSERT_TRUE(c.server(s).send_copy(Role::kWorker, w, {.type = kPing}, nullptr, 0).is_ok());
  // Servers are connected to each other for replication (PUSHPULL_PS_REPLICAS,
  // 1 by default with 2 servers), never to themselves.
  EXPECT_NO_THROW(c.server(0).conn(Role::kServer, 1));
  EXPECT_THROW(c.server(0).conn(Role::kServer, 0), NotFound);
  ASSERT_TRUE(test::wait_until([&] {
    std::lock_guard l(mu);
    return seen.size() == 6 + 6 + 6;
  }));
  std::lock_guard l(mu);
  std::set<std::pair<uint32_t, uint32_t>> unique(seen.begin(), seen.end());
  EXPECT_EQ(unique.size(), 18u);
  EXPECT_TRUE(unique.count({node_id(Role::kServer, 1), node_id(Role::kWorker, 2)}));
  EXPECT_TRUE(unique.count({node_id(Role::kWorker, 0), node_id(Role::kWorker, 2)}));
  EXPECT_EQ(Node::sender(transport::Header{.sender = node_id(Role::kWorker, 2)}).rank, 2);
}

// Mixed placement: the links between workers and a server get socket buffers
// scaled by that server's share (ps/server_shares.h), on both ends; worker-
// worker links keep theirs, and an explicit buffer size is never overridden.
TEST(Cluster, ServerLinkScaleSizesTheSocketBuffersOfThoseLinks) {
  InProcessCluster c({});
  auto rcvbuf = [](Node& n, Role role, int rank) {
    return n.transport().socket_receive_buffer(n.conn(role, rank));
  };
  Node& w = c.worker(0);
  const int before0 = rcvbuf(w, Role::kServer, 0), before1 = rcvbuf(w, Role::kServer, 1);
  const int peer_before = rcvbuf(w, Role::kWorker, 1);
  ASSERT_GT(before0, 0);
  EXPECT_EQ(before0, before1);
  w.set_server_link_scale({2.0, 0.5});
  EXPECT_EQ(rcvbuf(w, Role::kServer, 0), 2 * before0);
  EXPECT_EQ(rcvbuf(w, Role::kServer, 1), before1 / 2);
  EXPECT_EQ(rcvbuf(w, Role::kWorker, 1), peer_before);
  // Server 1's end of its links to every worker follows its own share.
  Node& s1 = c.server(1);
  const int server_before = rcvbuf(s1, Role::kWorker, 2);
  s1.set_server_link_scale({2.0, 0.5});
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(rcvbuf(s1, Role::kWorker, r), server_before / 2) << r;
  EXPECT_EQ(rcvbuf(s1, Role::kServer, 0), server_before) << "server-server links keep theirs";
  EXPECT_TRUE(c.shutdown().is_ok());
}

TEST(Cluster, AnExplicitSocketBufferIsNotScaled) {
  InProcessCluster::Config cfg;
  cfg.socket_buffer_bytes = 96 << 10;
  InProcessCluster c(cfg);
  Node& w = c.worker(0);
  const int before = w.transport().socket_receive_buffer(w.conn(Role::kServer, 0));
  w.set_server_link_scale({4.0, 0.25});
  EXPECT_EQ(w.transport().socket_receive_buffer(w.conn(Role::kServer, 0)), before);
  EXPECT_EQ(before, 2 * (96 << 10));
  EXPECT_TRUE(c.shutdown().is_ok());
}

TEST_P(ClusterOn, ADeadNodeFailsEveryoneWithItsName) {
  auto c = std::make_unique<InProcessCluster>(on_medium());
  std::atomic<int> callbacks{0};
  for (auto* n : c->nodes())
    n->on_peer_failure([&](const Status&) { ++callbacks; });
  // Stop worker 1's transport abruptly: its connections close.
  c->worker(1).transport().stop();
  for (int w : {0, 2}) {
    try {
      c->worker(w).barrier(Group::kAll, 10s);
      FAIL();
    } catch (const PeerFailure& e) {
      EXPECT_NE(std::string(e.what()).find("worker 1"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(test::wait_until([&] { return callbacks.load() >= 4; }));
  EXPECT_NE(c->server(0).failure().message().find("worker 1"), std::string::npos);
  std::promise<Status> sent;
  c->server(0).send(Role::kWorker, 0, {.type = 200}, "x", 1,
                    [&](const Status& s) { sent.set_value(s); });
  EXPECT_EQ(sent.get_future().get().code(), ErrorCode::kPeerFailure);
}

// Teardown order: after stop_delivery() no handler or failure callback of
// the node runs, so an upper layer may destroy what they use.
TEST_P(ClusterOn, NoHandlerRunsAfterStopDelivery) {
  constexpr uint16_t kPing = 201;
  std::atomic<int> pings{0};
  InProcessCluster::Config cfg = on_medium();
  cfg.servers = 1;
  cfg.workers = 2;
  cfg.setup = [&](Node& n) {
    n.set_handler(kPing, kPing, [&pings](transport::Message&&) { ++pings; });
  };
  InProcessCluster c(cfg);
  ASSERT_TRUE(c.worker(0).send_copy(Role::kServer, 0, {.type = kPing}, nullptr, 0).is_ok());
  ASSERT_TRUE(test::wait_until([&] { return pings.load() == 1; }));
  c.server(0).stop_delivery();
  c.server(0).stop_delivery();  // idempotent
  c.worker(0).send_copy(Role::kServer, 0, {.type = kPing}, nullptr, 0);
  // The server's connections closed: the others fail; the server hears nothing.
  ASSERT_TRUE(test::wait_until([&] { return !c.worker(1).failure().is_ok(); }));
  EXPECT_NE(c.worker(1).failure().message().find("server 0"), std::string::npos)
      << c.worker(1).failure().message();
  EXPECT_EQ(pings.load(), 1);
  EXPECT_TRUE(c.server(0).failure().is_ok()) << "nothing ran on the stopped node";
}

TEST_P(ClusterOn, WrongSecretIsRefusedAtOnce) {
  InProcessCluster::Config cfg = on_medium();
  cfg.servers = 1;
  cfg.workers = 1;
  cfg.job_secret = "s3cret";
  InProcessCluster c(cfg);
  Options o = c.options();
  o.net.job_secret = "wrong";
  o.cluster.role = Role::kWorker;
  Node intruder(o);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(intruder.start(), ProtocolError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_TRUE(c.shutdown().is_ok());
}

TEST_P(ClusterOn, RegistrationTimesOutWhenANodeIsMissing) {
  Options o;
  o.net.node_host = host();
  o.cluster.root_uri = host();
  o.cluster.root_port = 0;
  o.cluster.num_servers = 1;
  o.cluster.num_workers = 1;
  o.cluster.heartbeat_interval = 50ms;
  o.cluster.startup_timeout = 600ms;
  Scheduler s(o);
  o.cluster.root_port = s.bind();
  auto result = std::async(std::launch::async, [&] { return s.run(); });
  o.cluster.role = Role::kWorker;
  Node w(o);
  try {
    w.start();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("0 of 1 servers"), std::string::npos) << e.what();
  }
  Status st = result.get();
  EXPECT_EQ(st.code(), ErrorCode::kTimeout);
}

}  // namespace
}  // namespace pushpull::cluster
