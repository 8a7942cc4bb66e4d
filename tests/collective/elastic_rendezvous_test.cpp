// SPDX-License-Identifier: Apache-2.0
// The elastic rendezvous (collective/elastic_rendezvous.h, elastic_client.h,
// elastic_protocol.h): rounds forming over real connections, ranks kept
// across rounds, stale workers declined, newcomers announced, stragglers
// dropped, the launcher's refusal, and malformed messages.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <future>
#include <thread>

#include "collective/elastic_client.h"
#include "collective/elastic_rendezvous.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::collective::elastic {

using transport::TcpTransport;

namespace {

NetOptions net_options() {
  NetOptions n;
  n.job_id = "elastic-test";
  n.job_secret = "s3cret";
  return n;
}

struct Fixture {
  explicit Fixture(ServerConfig c = {}) {
    c.net = net_options();
    c.bind_host = "127.0.0.1";
    server = std::make_unique<RendezvousServer>(c);
    poller = std::thread([this] {
      while (!stop) {
        for (auto& s : server->poll())
          stragglers.push_back(s);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
  ~Fixture() { stop_polling(); }
  void stop_polling() {
    stop = true;
    if (poller.joinable()) poller.join();
  }
  std::unique_ptr<Client> client(const std::string& id) {
    server->add_worker(id);
    ClientConfig c;
    c.net = net_options();
    c.server_host = "127.0.0.1";
    c.server_port = server->port();
    c.worker_id = id;
    return std::make_unique<Client>(c);
  }
  std::unique_ptr<RendezvousServer> server;
  std::thread poller;
  std::atomic<bool> stop{false};
  std::vector<std::string> stragglers;  // poller thread only until joined
};

std::future<Assignment> join_async(Client& c, int port, Millis timeout = Millis(10000)) {
  return std::async(std::launch::async,
                    [&c, port, timeout] { return c.join("127.0.0.1", port, timeout); });
}

TEST(ElasticProtocol, RoundTripsAndRejectsMalformedInput) {
  Assignment a{7, 1, 3, {{"10.0.0.1", 5000}, {"10.0.0.2", 5001}}};
  auto bytes = encode(a);
  Assignment b;
  ASSERT_TRUE(decode(bytes.data(), bytes.size(), &b).is_ok());
  EXPECT_EQ(b.round, 7u);
  EXPECT_EQ(b.rank, 1);
  EXPECT_EQ(b.hosts_stamp, 3u);
  EXPECT_EQ(b.book, a.book);
  for (size_t cut = 0; cut < bytes.size(); ++cut)
    EXPECT_FALSE(decode(bytes.data(), cut, &b).is_ok()) << cut;
  Assignment bad{1, 5, 0, {{"h", 1}}};  // rank out of range
  bytes = encode(bad);
  EXPECT_FALSE(decode(bytes.data(), bytes.size(), &b).is_ok());
  JoinRequest j{"w1", "127.0.0.1", 4000}, k;
  bytes = encode(j);
  ASSERT_TRUE(decode(bytes.data(), bytes.size(), &k).is_ok());
  EXPECT_EQ(k.worker_id, "w1");
  JoinRequest no_port{"w1", "h", 0};
  bytes = encode(no_port);
  EXPECT_FALSE(decode(bytes.data(), bytes.size(), &k).is_ok());
  EXPECT_NE(round_job_id("job", 1), round_job_id("job", 2));
}

TEST(ElasticRendezvous, RoundsKeepTheSurvivorsOrderAndDeclineTheDead) {
  Fixture f;
  auto a = f.client("a"), b = f.client("b"), c = f.client("c");
  auto fa = join_async(*a, 1001), fb = join_async(*b, 1002), fc = join_async(*c, 1003);
  Assignment ra = fa.get(), rb = fb.get(), rc = fc.get();
  EXPECT_EQ(ra.round, 1u);
  EXPECT_EQ(ra.size(), 3);
  EXPECT_EQ(ra.book, rb.book);
  std::set<int> ranks{ra.rank, rb.rank, rc.rank};
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  // The member of rank 1 dies; the other two re-form in their old order.
  std::map<int, Client*> by_rank{{ra.rank, a.get()}, {rb.rank, b.get()}, {rc.rank, c.get()}};
  const std::vector<std::string> members = f.server->current().members;
  f.server->remove_worker(members[1], "died");
  auto f0 = join_async(*by_rank[0], 2001), f2 = join_async(*by_rank[2], 2003);
  Assignment r0 = f0.get(), r2 = f2.get();
  EXPECT_EQ(r0.round, 2u);
  EXPECT_EQ(r0.size(), 2);
  EXPECT_EQ(r0.rank, 0);  // rank 0 (the committed state's holder) stays rank 0
  EXPECT_EQ(r2.rank, 1);
  EXPECT_EQ(f.server->current().members, (std::vector<std::string>{members[0], members[2]}));
  // The dead worker cannot come back into any round.
  EXPECT_THROW(by_rank[1]->join("127.0.0.1", 2002, Millis(5000)), InvalidArgument);
}

// A port nobody listens on now (the mesh transports below bind it).
int unused_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A member that dies after its round formed but before it connected its
// mesh: the survivors stop waiting for it when the launcher reports it, not
// at the connect timeout, whether the news came before they attached their
// mesh (rank 1 here) or while they wait (rank 0).
TEST(ElasticRendezvous, AMemberLostBeforeTheMeshConnectsEndsTheOthersWaitAtOnce) {
  Fixture f;
  auto a = f.client("a"), b = f.client("b"), c = f.client("c");
  const int pa = unused_port(), pb = unused_port(), pc = unused_port();
  auto fa = join_async(*a, pa), fb = join_async(*b, pb), fc = join_async(*c, pc);
  Assignment ra = fa.get(), rb = fb.get(), rc = fc.get();
  std::map<int, std::pair<Client*, Assignment>> by_rank{
      {ra.rank, {a.get(), ra}}, {rb.rank, {b.get(), rb}}, {rc.rank, {c.get(), rc}}};
  NetOptions mesh = net_options();
  mesh.job_id = "elastic-test#mesh";
  mesh.connect_timeout = Millis(30000);
  auto transport = [&](int rank) {
    const Assignment& as = by_rank[rank].second;
    return std::make_unique<TcpTransport>(rank, 3, mesh, "127.0.0.1",
                                          as.book[static_cast<size_t>(rank)].second);
  };
  auto t0 = transport(0), t1 = transport(1);
  by_rank[0].first->attach(ra.round, t0->verdict_port());
  const auto start = std::chrono::steady_clock::now();
  auto connect0 = std::async(std::launch::async, [&] { t0->connect_all(ra.book); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  f.server->remove_worker(f.server->current().members[2], "worker c was SIGKILLed");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  by_rank[1].first->attach(ra.round, t1->verdict_port());
  EXPECT_THROW(t1->connect_all(ra.book), PeerFailure);
  EXPECT_THROW(connect0.get(), PeerFailure);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// A member that finished (exit 0) leaves without a member-gone notice: a
// slower member still finishing must not re-form alone (it then failed
// "after training finished"); a member that died is announced.
TEST(ElasticRendezvous, AFinishedMemberLeavesQuietlyADeadOneIsAnnounced) {
  for (bool announce : {false, true}) {
    SCOPED_TRACE(announce ? "died" : "finished");
    Fixture f;
    auto a = f.client("a"), b = f.client("b");
    const int pa = unused_port(), pb = unused_port();
    auto fa = join_async(*a, pa), fb = join_async(*b, pb);
    Assignment ra = fa.get(), rb = fb.get();
    Client* first = ra.rank == 0 ? a.get() : b.get();
    const Assignment& as = ra.rank == 0 ? ra : rb;
    NetOptions mesh = net_options();
    mesh.job_id = "elastic-test#mesh";
    TcpTransport t0(0, 2, mesh, "127.0.0.1", as.book[0].second);
    first->attach(as.round, t0.verdict_port());
    f.server->remove_worker(f.server->current().members[1],
                            announce ? "worker b was SIGKILLed" : "worker b finished", announce);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(t0.verdict().has_value(), announce);
  }
}

TEST(ElasticRendezvous, ANewcomerIsAnnouncedAndJoinsAtTheMembersNextRound) {
  Fixture f;
  auto a = f.client("a"), b = f.client("b");
  auto fa = join_async(*a, 1001), fb = join_async(*b, 1002);
  fa.get();
  fb.get();
  EXPECT_EQ(a->hosts_stamp(), 0u);
  auto n = f.client("new");
  auto fn = join_async(*n, 1003);
  // The members hear of it (their next commit raises HostsUpdatedInterrupt)...
  for (int i = 0; i < 500 && (a->hosts_stamp() == 0 || b->hosts_stamp() == 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(a->hosts_stamp(), 1u);
  EXPECT_EQ(b->hosts_stamp(), 1u);
  EXPECT_EQ(fn.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  // ... and re-form with it, after them in rank order.
  auto fa2 = join_async(*a, 2001), fb2 = join_async(*b, 2002);
  Assignment rn = fn.get();
  EXPECT_EQ(rn.round, 2u);
  EXPECT_EQ(rn.size(), 3);
  EXPECT_EQ(rn.rank, 2);
  EXPECT_EQ(rn.hosts_stamp, 1u);  // the round includes the change
  EXPECT_EQ(fa2.get().round, 2u);
  EXPECT_EQ(fb2.get().hosts_stamp, 1u);
}

TEST(ElasticRendezvous, AMemberThatNeverComesBackIsDroppedAsAStraggler) {
  ServerConfig c;
  c.member_window = Millis(300);
  Fixture f(c);
  auto a = f.client("a"), b = f.client("b"), h = f.client("hung");
  auto fa = join_async(*a, 1), fb = join_async(*b, 2), fh = join_async(*h, 3);
  fa.get();
  fb.get();
  fh.get();
  auto fa2 = join_async(*a, 11), fb2 = join_async(*b, 12);
  EXPECT_EQ(fa2.get().size(), 2);
  EXPECT_EQ(fb2.get().size(), 2);
  f.stop_polling();
  EXPECT_EQ(f.stragglers, (std::vector<std::string>{"hung"}));
}

TEST(ElasticRendezvous, TooFewWaitThenTheLaunchersRefusalEndsTheJoin) {
  ServerConfig c;
  c.min_workers = 2;
  Fixture f(c);
  auto a = f.client("a");
  auto fa = join_async(*a, 1);
  EXPECT_EQ(fa.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  f.server->refuse_all(Status(ErrorCode::kInternal, "fewer than --min-workers 2"));
  EXPECT_THROW(fa.get(), Internal);
}

TEST(ElasticRendezvous, AWrongSecretNeverReachesTheServer) {
  Fixture f;
  f.server->add_worker("x");
  ClientConfig c;
  c.net = net_options();
  c.net.job_secret = "wrong";
  c.net.connect_timeout = Millis(2000);
  c.server_host = "127.0.0.1";
  c.server_port = f.server->port();
  c.worker_id = "x";
  EXPECT_ANY_THROW({
    Client client(c);
    client.join("127.0.0.1", 1, Millis(2000));
  });
}

// A round's place in the environment, as a fixed job's launcher sets it
// (docs/elastic.md, "Ranks in the environment"): the second process on host
// b of a round a, b, b, c.
TEST(ElasticClient, PublishRoundEnvSetsTheRanksOfTheRound) {
  Assignment a;
  a.round = 3;
  a.rank = 2;
  a.book = {{"a", 1}, {"b", 2}, {"b", 3}, {"c", 4}};
  publish_round_env(a);
  auto var = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "(unset)");
  };
  EXPECT_EQ(var("RANK"), "2");
  EXPECT_EQ(var("PUSHPULL_RANK"), "2");
  EXPECT_EQ(var("WORLD_SIZE"), "4");
  EXPECT_EQ(var("PUSHPULL_WORLD_SIZE"), "4");
  EXPECT_EQ(var("LOCAL_RANK"), "1");
  EXPECT_EQ(var("PUSHPULL_LOCAL_RANK"), "1");
  EXPECT_EQ(var("LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(var("PUSHPULL_LOCAL_SIZE"), "2");
  EXPECT_EQ(var("HOROVOD_RANK"), "2");
  EXPECT_EQ(var("HOROVOD_SIZE"), "4");
  EXPECT_EQ(var("HOROVOD_LOCAL_RANK"), "1");
  EXPECT_EQ(var("HOROVOD_LOCAL_SIZE"), "2");
  EXPECT_EQ(var("HOROVOD_CROSS_RANK"), "1");
  EXPECT_EQ(var("HOROVOD_CROSS_SIZE"), "2");
  a.rank = 0;  // a later round
  a.book = {{"b", 2}};
  publish_round_env(a);
  EXPECT_EQ(var("RANK"), "0");
  EXPECT_EQ(var("WORLD_SIZE"), "1");
  EXPECT_EQ(var("HOROVOD_LOCAL_SIZE"), "1");
  EXPECT_EQ(var("HOROVOD_CROSS_SIZE"), "1");
  for (const char* name :
       {"RANK", "PUSHPULL_RANK", "WORLD_SIZE", "PUSHPULL_WORLD_SIZE", "LOCAL_RANK",
        "PUSHPULL_LOCAL_RANK", "LOCAL_WORLD_SIZE", "PUSHPULL_LOCAL_SIZE", "HOROVOD_RANK",
        "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
        "HOROVOD_CROSS_SIZE"})
    ::unsetenv(name);  // the other tests of this binary read none, but leave it clean
}

}  // namespace
}  // namespace pushpull::collective::elastic
