// SPDX-License-Identifier: Apache-2.0
// Bootstrap and Session, ranks as threads of this process over real TCP on
// loopback: the MASTER_ADDR rendezvous, the scheduler's address book, a world
// of one, the free functions, and the failure cases (a missing rank, a rank
// that dies during the rendezvous, conflicting settings).
#include "collective/bootstrap.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <future>
#include <thread>

#include <fmt/format.h>

#include "cluster/scheduler.h"
#include "collective/store.h"
#include "pushpull/collective.h"
#include "support/ports.h"
#include "transport/socket.h"
#include "transport/tcp/message_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::collective {
namespace {

using ::testing::HasSubstr;

Options rendezvous_options(int rank, int size, int port, Millis startup = Millis(20000)) {
  Options o;
  o.collective.rank = rank;
  o.collective.size = size;
  o.collective.master_addr = "127.0.0.1";
  o.collective.master_port = port;
  o.net.node_host = "127.0.0.1";
  o.cluster.startup_timeout = startup;
  o.cluster.heartbeat_timeout = Millis(5000);
  // free_port() is racy on a shared machine: a job id of our own makes a
  // collision with another program a quick refusal, not a wait.
  o.net.job_id = "bootstrap-test-" + std::to_string(port);
  return o;
}

// Runs fn(rank) on n threads; returns each thread's exception (or null).
std::vector<std::exception_ptr> on_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads)
    t.join();
  return errors;
}

std::string what(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return {};
}

template <typename E>
bool is(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

TEST(Bootstrap, ModeSelection) {
  Options o;
  EXPECT_EQ(bootstrap_mode(o), BootstrapMode::kSingle);
  o.collective.rank = 0;
  o.collective.size = 1;
  EXPECT_EQ(bootstrap_mode(o), BootstrapMode::kSingle);
  o.collective.size = 2;
  try {
    bootstrap_mode(o);
    ADD_FAILURE() << "no error without a rendezvous address";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("MASTER_ADDR"));
  }
  o.collective.master_addr = "127.0.0.1";
  o.collective.master_port = 1234;
  EXPECT_EQ(bootstrap_mode(o), BootstrapMode::kRendezvous);
  o.collective.rank = 2;
  EXPECT_THROW(bootstrap_mode(o), InvalidArgument);  // rank >= size
  o.collective.rank = 0;
  o.collective.size = -1;
  EXPECT_THROW(bootstrap_mode(o), InvalidArgument);  // a rank without a size
  Options w;
  w.cluster.role = Role::kWorker;
  w.cluster.num_servers = 2;
  EXPECT_EQ(bootstrap_mode(w), BootstrapMode::kCluster);
  w.cluster.role = Role::kServer;
  EXPECT_THROW(bootstrap_mode(w), InvalidArgument);
}

TEST(Bootstrap, LocalRanksCountSameHosts) {
  std::vector<std::string> hosts{"a", "b", "a", "a", "b"};
  EXPECT_EQ(local_of(hosts, 0), std::make_pair(0, 3));
  EXPECT_EQ(local_of(hosts, 3), std::make_pair(2, 3));
  EXPECT_EQ(local_of(hosts, 4), std::make_pair(1, 2));
}

// Many ranks share a host: rank 0's book (its verdict, store.h) names each
// host once (transport/host_table.h), and only its one canonical form decodes.
TEST(Bootstrap, BooksNameEachHostOnceAndOnlyTheCanonicalFormDecodes) {
  AddressList book;
  for (int r = 0; r < 64; ++r)
    book.emplace_back(fmt::format("node-{:02}.cluster.example", r / 8), 40000 + r);
  auto bytes = encode_verdict({}, book);
  EXPECT_LT(bytes.size(), 8 * (4 + 24) + 64 * 6 + 12u);  // 8 host strings, 6 bytes a rank
  AddressList back;
  Status verdict;
  ASSERT_TRUE(decode_verdict(bytes, &verdict, &back).is_ok());
  EXPECT_TRUE(verdict.is_ok());
  EXPECT_EQ(back, book);
  auto reject = [&](const std::function<void(transport::Writer&)>& write) {
    transport::Writer w;
    w.u<uint32_t>(0);  // the verdict: ok, then the book
    write(w);
    AddressList out;
    return !decode_verdict(w.data(), &verdict, &out).is_ok();
  };
  auto entry = [](transport::Writer& w, uint32_t host, uint16_t port) {
    w.u<uint32_t>(host).u<uint16_t>(port);
  };
  // The same table and entries as encode_verdict writes decode...
  EXPECT_FALSE(reject([&](transport::Writer& w) {
    w.u<uint32_t>(2).str("a").str("b").u<uint32_t>(3);
    entry(w, 0, 1), entry(w, 1, 2), entry(w, 0, 3);
  }));
  // ...a host listed twice, a host never used, a new host out of first-use
  // order, an index past the table and port 0 do not.
  EXPECT_TRUE(reject([&](transport::Writer& w) {
    w.u<uint32_t>(2).str("a").str("a").u<uint32_t>(2);
    entry(w, 0, 1), entry(w, 1, 2);
  }));
  EXPECT_TRUE(reject([&](transport::Writer& w) {
    w.u<uint32_t>(2).str("a").str("b").u<uint32_t>(1);
    entry(w, 0, 1);
  }));
  EXPECT_TRUE(reject([&](transport::Writer& w) {
    w.u<uint32_t>(2).str("a").str("b").u<uint32_t>(2);
    entry(w, 1, 1), entry(w, 0, 2);
  }));
  EXPECT_TRUE(reject([&](transport::Writer& w) {
    w.u<uint32_t>(1).str("a").u<uint32_t>(1);
    entry(w, 1, 1);
  }));
  EXPECT_TRUE(reject([&](transport::Writer& w) {
    w.u<uint32_t>(1).str("a").u<uint32_t>(1);
    entry(w, 0, 0);
  }));
}

class SessionsOverRendezvous : public ::testing::TestWithParam<int> {};

TEST_P(SessionsOverRendezvous, EveryRankJoinsAndAllreduces) {
  const int n = GetParam();
  const int port = test::free_port();
  auto errors = on_threads(n, [&](int r) {
    Session s(rendezvous_options(r, n, port));
    EXPECT_EQ(s.rank(), r);
    EXPECT_EQ(s.size(), n);
    EXPECT_EQ(s.local_rank(), r);  // every rank on 127.0.0.1
    EXPECT_EQ(s.local_size(), n);
    EXPECT_EQ(s.mode(), n == 1 ? "single" : "rendezvous");
    Array a = Array::full(Shape{1000}, r + 1.0);
    s.communicator().allreduce("x", a.view());
    EXPECT_EQ(a.as<float>()[999], n * (n + 1) / 2.0f);
    s.communicator().barrier();
  });
  for (auto& e : errors)
    EXPECT_FALSE(e) << what(e);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SessionsOverRendezvous, ::testing::Values(1, 2, 3, 4));

// `pushpull launch` binds rank 0's rendezvous port itself and hands worker 0
// the listening socket (PUSHPULL_LISTEN_FD): rank 0 listens on that socket.
// Binding the port again would fail (the launcher's socket holds it), so a
// job that meets proves the socket was taken over.
TEST(Bootstrap, RankZeroListensOnTheSocketItInherited) {
  transport::Fd held = transport::listen_on("127.0.0.1", 0);
  const int port = transport::local_port(held.get());
  // What Options::from_env() reads from PUSHPULL_LISTEN_FD.
  const std::string inherited = std::to_string(held.get());
  held.release();  // rank 0's now
  auto errors = on_threads(2, [&](int r) {
    Options o = rendezvous_options(r, 2, port);
    o.net.inherited_listener = inherited;
    Session s(o);
    Array a = Array::full(Shape{10}, r + 1.0);
    s.communicator().allreduce("x", a.view());
    EXPECT_EQ(a.as<float>()[9], 3.0f);
  });
  for (auto& e : errors)
    EXPECT_FALSE(e) << what(e);
}

// A cluster job on this host: a scheduler, one server and `workers` worker
// threads, each running `worker` with its Options (role worker, the
// scheduler's port). Checks that the job ended in order.
void run_cluster_job(int workers, const std::function<void(const Options&)>& worker) {
  Options base;
  base.cluster.num_servers = 1;
  base.cluster.num_workers = workers;
  base.cluster.root_uri = "127.0.0.1";
  base.cluster.root_port = 0;
  base.cluster.heartbeat_interval = Millis(200);
  base.cluster.heartbeat_timeout = Millis(5000);
  base.cluster.startup_timeout = Millis(20000);
  base.net.node_host = "127.0.0.1";
  Options so = base;
  so.cluster.role = Role::kScheduler;
  cluster::Scheduler scheduler(so);
  base.cluster.root_port = scheduler.bind();
  auto result = std::async(std::launch::async, [&] { return scheduler.run(); });
  auto server = std::async(std::launch::async, [&] {
    Options o = base;
    o.cluster.role = Role::kServer;
    cluster::Node node(o);
    node.start();
    node.shutdown();  // waits until every worker left
  });
  auto errors = on_threads(workers, [&](int) {
    Options o = base;
    o.cluster.role = Role::kWorker;
    worker(o);
  });
  for (auto& e : errors)
    EXPECT_FALSE(e) << what(e);
  if (std::any_of(errors.begin(), errors.end(), [](auto& e) { return e != nullptr; }))
    scheduler.stop();
  EXPECT_NO_THROW(server.get());
  Status st = result.get();
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

TEST(Bootstrap, ClusterModeUsesTheSchedulersAddressBook) {
  const int workers = 3;
  run_cluster_job(workers, [&](const Options& o) {
    Session s(o);
    EXPECT_EQ(s.mode(), "cluster");
    EXPECT_EQ(s.size(), workers);
    EXPECT_EQ(s.local_size(), workers);
    Array a = Array::full(Shape{100000}, s.rank() + 1.0);
    s.communicator().allreduce("grad", a.view());
    EXPECT_EQ(a.as<float>()[0], 6.0f);
    Array g = s.communicator().allgather("ranks", Array::full(Shape{1}, s.rank()).view());
    EXPECT_EQ(g.as<float>()[2], 2.0f);
    s.shutdown();  // leaves the job in order
  });
}

// Through the scheduler, each worker's mesh port travels in its
// registration: the mesh forms from the address book, and the workers' Nodes
// open no connections to each other (start-up linear in the job, issue 38).
TEST(Bootstrap, ClusterModeTradesNoPortsWorkerToWorker) {
  const int workers = 3;
  run_cluster_job(workers, [&](const Options& base) {
    Options o = base;
    o.collective.shared_memory = false;
    Bootstrapped b = bootstrap(o);
    ASSERT_EQ(b.mode, BootstrapMode::kCluster);
    ASSERT_EQ(b.book.size(), static_cast<size_t>(workers));
    const int me = b.node->rank();
    const cluster::AddressBook& book = b.node->address_book();
    for (int r = 0; r < workers; ++r) {
      EXPECT_EQ(b.book[static_cast<size_t>(r)].second,
                book.workers[static_cast<size_t>(r)].mesh_port);
      EXPECT_GT(b.book[static_cast<size_t>(r)].second, 0);
      if (r != me) {
        EXPECT_THROW(b.node->conn(Role::kWorker, r), NotFound) << "worker " << r;
      }
    }
    EXPECT_EQ(b.book[static_cast<size_t>(me)].second, b.mesh->port());
    b.transport->close(Status::ok());
    b.node->shutdown();
  });
}

TEST(Bootstrap, AMissingRankTimesOutNamingIt) {
  const int port = test::free_port();
  auto start = std::chrono::steady_clock::now();
  auto errors =
      on_threads(2, [&](int r) { Session s(rendezvous_options(r, 3, port, Millis(1500))); });
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(errors[0]);
  EXPECT_TRUE(is<Timeout>(errors[0])) << what(errors[0]);
  EXPECT_THAT(what(errors[0]), HasSubstr("for ranks 2"));
  ASSERT_TRUE(errors[1]);  // told by rank 0 at once, not left to its own deadline
  EXPECT_THAT(what(errors[1]), HasSubstr("for ranks 2"));
  EXPECT_LT(took, std::chrono::seconds(6));
}

TEST(Bootstrap, ARankTakenTwiceIsRefusedWithoutFailingTheOthers) {
  // Two processes claim rank 1: the second is refused at its hello (the
  // identity is taken) and only it fails at once; the others go on and
  // time out waiting for the real rank 2.
  const int port = test::free_port();
  auto errors = on_threads(
      3, [&](int t) { Session s(rendezvous_options(t == 2 ? 1 : t, 3, port, Millis(3000))); });
  int refused = 0, timed_out = 0;
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    if (is<ProtocolError>(e)) {
      ++refused;
      EXPECT_THAT(what(e), HasSubstr("already connected"));
    } else {
      ++timed_out;
      EXPECT_TRUE(is<Timeout>(e)) << what(e);
      EXPECT_THAT(what(e), HasSubstr("for ranks 2"));
    }
  }
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(timed_out, 2);
}

TEST(FreeFunctions, ThrowBeforeInitAndWorkInAWorldOfOne) {
  ASSERT_FALSE(is_initialized());
  try {
    rank();
    ADD_FAILURE() << "no error before init()";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("call pushpull::collective::init() first"));
  }
  Array a = Array::full(Shape{5}, 2.0);
  EXPECT_THROW(allreduce("a", a.view()), InvalidArgument);
  init(Options{});  // nothing set: a world of one
  init(Options{});  // a second init does nothing
  EXPECT_TRUE(is_initialized());
  EXPECT_EQ(size(), 1);
  EXPECT_EQ(rank(), 0);
  EXPECT_EQ(local_rank(), 0);
  EXPECT_EQ(local_size(), 1);
  // The variables Python mirrors into os.environ: the same table as the
  // launcher's and an elastic round's (base/rank_environment.h).
  const auto env = rank_environment();
  ASSERT_EQ(env.size(), 14u);
  for (const auto& [name, value] : env)
    EXPECT_EQ(value, name.find("SIZE") != std::string::npos ? "1" : "0") << name;
  Handle h = allreduce_async("a", a.view(), Reduction::kAverage);
  wait(h);
  EXPECT_TRUE(poll(h));
  EXPECT_EQ(a.as<float>()[4], 2.0f);
  broadcast("b", a.view(), 0);
  EXPECT_EQ(allgather("g", a.view()).numel(), 5);
  EXPECT_EQ(reduce_scatter("r", a.view()).numel(), 5);
  barrier();
  join();
  shutdown();
  EXPECT_FALSE(is_initialized());
  EXPECT_THROW(size(), InvalidArgument);
  shutdown();  // nothing to shut down: fine
}

}  // namespace
}  // namespace pushpull::collective
