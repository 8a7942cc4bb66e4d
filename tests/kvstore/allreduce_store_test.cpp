// SPDX-License-Identifier: Apache-2.0
// What only the dist_sync_allreduce KVStore does, with its workers as threads
// of this process over the in-process collective transport, plus the real
// bootstrap (create_kvstore with a MASTER_ADDR rendezvous on loopback). What
// every store type does is in conformance_test.cpp.
#include "kvstore/allreduce_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "collective/harness.h"
#include "support/ports.h"
#include "transport/inproc/inprocess_transport.h"

namespace pushpull {
namespace {

Options store_options() {
  Options o;
  o.kvstore.wait_timeout = Millis(30000);
  o.kvstore.engine_threads = 2;
  return o;
}

collective::CommunicatorOptions comm_options() {
  collective::CommunicatorOptions c;
  c.peer_timeout = Millis(5000);
  c.wait_timeout = Millis(30000);
  c.collective.cycle_time_ms = 0.5;
  return c;
}

// Runs body(store) for n workers on n threads; rethrows the first exception.
// A worker that throws destroys its store, which fails the others' pending
// collectives with PeerFailure instead of leaving them waiting.
void run_workers(int n, const std::function<void(KVStore&)>& body) {
  transport::InProcessFabric fabric(n);
  collective::testing::on_threads(n, [&](int r) {
    auto comm = std::make_unique<collective::Communicator>(fabric.endpoint(r), comm_options());
    AllreduceStore store("dist_sync_allreduce", store_options(), std::move(comm));
    body(store);
  });
}

// Workers push keys in opposite orders and keep several pushes of one key in
// flight (more than the store's name slots): no deadlock, every push applied.
TEST(AllreduceStore, AsyncPushesInDifferentOrdersAllApply) {
  run_workers(2, [](KVStore& kv) {
    const int keys = 8, pushes = 7;
    std::vector<Key> ks;
    std::vector<Array> init;
    for (int k = 0; k < keys; ++k) {
      ks.emplace_back(k);
      init.push_back(Array::full(Shape{300}, 0.0));
    }
    kv.init(ks, std::vector<ArrayView>(init.begin(), init.end()));
    kv.set_optimizer(OptimizerSpec::parse("test:rescale_grad=1"));
    Array g = Array::full(Shape{300}, 1.0);
    std::vector<KVHandle> hs;
    for (int p = 0; p < pushes; ++p)
      for (int i = 0; i < keys; ++i) {
        int k = kv.rank() == 0 ? i : keys - 1 - i;
        hs.push_back(kv.push_async({Key(k)}, {ArrayList{g.view()}}, 0));
      }
    for (auto& h : hs)
      kv.wait(h);
    for (int k = 0; k < keys; ++k) {
      Array out(Shape{300}, DType::kFloat32);
      kv.pull(k, out.view());
      EXPECT_EQ(out.as<float>()[299], 2.0f * pushes) << "key " << k;
    }
    kv.barrier();
  });
}

TEST(AllreduceStore, ADeadWorkerFailsThePushesOfTheOthers) {
  transport::InProcessFabric fabric(2);
  auto c0 = std::make_unique<collective::Communicator>(fabric.endpoint(0), comm_options());
  auto c1 = std::make_unique<collective::Communicator>(fabric.endpoint(1), comm_options());
  AllreduceStore s0("dist_sync_allreduce", store_options(), std::move(c0));
  std::thread t([&] {
    AllreduceStore s1("dist_sync_allreduce", store_options(), std::move(c1));
    s1.init(1, Array::full(Shape{10}, 1.0).view());
  });  // worker 1 is gone after init
  s0.init(1, Array::full(Shape{10}, 1.0).view());
  t.join();
  Array g = Array::full(Shape{10}, 1.0);
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(s0.push(1, g.view()), PeerFailure);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(6));
}

// create_kvstore with the real bootstrap: a MASTER_ADDR rendezvous on loopback.
TEST(AllreduceStore, CreateKvstoreBootstrapsFromTheOptions) {
  const int n = 2, port = test::free_port();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        Options o = store_options();
        o.collective.rank = r;
        o.collective.size = n;
        o.collective.master_addr = "127.0.0.1";
        o.collective.master_port = port;
        o.cluster.startup_timeout = Millis(20000);
        // free_port() is racy on a shared machine: a job id of our own makes
        // a collision with another program a quick refusal, not a wait.
        o.net.job_id = "allreduce-store-test-" + std::to_string(port);
        auto kv = create_kvstore(r == 0 ? "dist_sync_allreduce" : "allreduce", o);
        EXPECT_EQ(kv->rank(), r);
        kv->init("w", Array::full(Shape{3}, r == 0 ? 5.0 : 0.0).view());
        Array out(Shape{3}, DType::kFloat32);
        kv->pull("w", out.view());
        EXPECT_EQ(out.as<float>()[2], 5.0f);
        kv->push("w", Array::full(Shape{3}, 1.0 + r).view());
        kv->pull("w", out.view());
        EXPECT_EQ(out.as<float>()[0], 3.0f);
        kv->barrier();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads)
    t.join();
  for (auto& e : errors)
    EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace pushpull
