// SPDX-License-Identifier: Apache-2.0
// The networked parameter server (ps/server.h) in an in-process cluster:
// crafted requests a worker could send (sizes that overflow, ranges past the
// value, bad dtypes and types, garbage payloads) get error replies and the
// server keeps serving the real workers; and a Server torn down while pushes
// are arriving never touches its destroyed store. Lent replicas:
// server_lending_test.cpp.
#include "ps/server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <thread>

#include "ps/protocol.h"
#include "server_inbox.h"
#include "support/cluster_harness.h"
#include "support/media.h"

namespace pushpull::ps {
namespace {

using namespace server_testing;

// A cluster of 1 server (running a Server) and `workers` bare worker nodes
// that speak the PS protocol by hand, on `host`'s medium.
class ServerJob {
 public:
  ServerJob(int workers, const std::string& host) : inboxes_(static_cast<size_t>(workers)) {
    test::InProcessCluster::Config c;
    c.host = host;
    c.servers = 1;
    c.workers = workers;
    c.setup = [this](cluster::Node& n) {
      if (n.role() == Role::kServer) {
        server_ = std::make_unique<Server>(n);
      } else {
        // Ranks are assigned at start: route by the rank then.
        n.set_handler(msg::kFirst, msg::kLast, [this, &n](transport::Message&& m) {
          inboxes_.at(static_cast<size_t>(n.rank())).add(std::move(m));
        });
      }
    };
    cluster_ = std::make_unique<test::InProcessCluster>(c);
  }
  ~ServerJob() {
    server_.reset();  // before its node
    cluster_.reset();
  }

  uint64_t send(int worker, transport::Header h, std::span<const std::byte> payload = {}) {
    h.request_id = ++next_id_;
    Status s =
        cluster_->worker(worker).send_copy(Role::kServer, 0, h, payload.data(), payload.size());
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return h.request_id;
  }
  Answer wait(int worker, uint64_t id) { return inboxes_.at(static_cast<size_t>(worker)).wait(id); }
  void destroy_server() { server_.reset(); }
  test::InProcessCluster& cluster() { return *cluster_; }

 private:
  std::vector<Inbox> inboxes_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<test::InProcessCluster> cluster_;
  std::atomic<uint64_t> next_id_{0};
};

// Every test runs over each medium (support/media.h).
class ServerOn : public test::Medium {};
INSTANTIATE_TEST_SUITE_P(Media, ServerOn, ::testing::ValuesIn(test::kMedia), test::medium_name);

TEST_P(ServerOn, CraftedRequestsGetErrorsAndTheRealWorkersAreStillServed) {
  ServerJob job(2, host());
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> bad;
  // init whose count * dtype size overflows to the (empty) value's size: 2^62 * 4 = 2^64 = 0.
  auto empty_init = encode_init("evil", {});
  bad.push_back(job.send(1, header(msg::kInit, 66, 0, uint64_t{1} << 62), empty_init));
  // init with a count that is negative as int64, and a slice begin past int64.
  bad.push_back(job.send(1, header(msg::kInit, 67, 0, max), empty_init));
  bad.push_back(
      job.send(1, header(msg::kInit, 68, max, 1), encode_init("x", std::vector<std::byte>(4))));
  // init payload too short for its name; bad dtype (0x101 passes a u8 check).
  bad.push_back(job.send(1, header(msg::kInit, 69, 0, 1), std::vector<std::byte>{std::byte{9}}));
  auto h = header(msg::kPush, 70, 0, 1);
  h.dtype = 0x101;
  bad.push_back(job.send(1, h, std::vector<std::byte>(4)));
  // A type in the PS range that the server does not serve.
  bad.push_back(job.send(1, header(70, 1, 0, 0)));

  // The real job: worker 0 inits key 1, both workers push, both pull.
  std::vector<float> init(8, 1.0f), g0(8, 2.0f), g1(8, 3.0f);
  auto ok_init = job.send(0, header(msg::kInit, 1, 0, 8), encode_init("w", bytes_of(init)));
  EXPECT_EQ(job.wait(0, ok_init).type, msg::kReply);
  // Pulls whose begin + count overflows, or that lie past the value.
  bad.push_back(job.send(1, header(msg::kPull, 1, 0, 8),
                         encode_ranges({Range{1, std::numeric_limits<int64_t>::max()}})));
  bad.push_back(job.send(1, header(msg::kPull, 1, 0, 8), encode_ranges({Range{4, 100}})));
  bad.push_back(job.send(1, header(msg::kPull, 1, 0, 8), encode_ranges({Range{7, 2}})));
  bad.push_back(job.send(1, header(msg::kPull, 1, 0, 8), std::vector<std::byte>(5)));
  // A push of the wrong size, and commands that make no sense.
  bad.push_back(job.send(1, header(msg::kPush, 1, 0, 8), std::vector<std::byte>(6)));
  auto cmd = header(msg::kCommand, 99, 0, 0);
  bad.push_back(job.send(1, cmd));
  cmd.key = static_cast<uint64_t>(Command::kLoadStates);
  bad.push_back(job.send(1, cmd, std::vector<std::byte>(7, std::byte{0xff})));

  for (uint64_t id : bad) {
    Answer a = job.wait(1, id);
    EXPECT_EQ(a.type, msg::kError) << "request " << id;
    EXPECT_NE(a.code(), ErrorCode::kOk) << "request " << id;
  }

  auto p0 = job.send(0, header(msg::kPush, 1, 0, 8), bytes_of(g0));
  auto p1 = job.send(1, header(msg::kPush, 1, 0, 8), bytes_of(g1));
  auto pull0 = job.send(0, header(msg::kPull, 1, 0, 8));
  EXPECT_EQ(job.wait(0, p0).type, msg::kReply);
  EXPECT_EQ(job.wait(1, p1).type, msg::kReply);
  Answer a = job.wait(0, pull0);
  ASSERT_EQ(a.type, msg::kReply);
  ASSERT_EQ(a.payload.size(), 32u);
  std::vector<float> got(8);
  std::memcpy(got.data(), a.payload.data(), 32);
  for (float v : got)
    EXPECT_EQ(v, 5.0f);  // no optimizer: the round's sum replaces the value
}

TEST_P(ServerOn, OnlyWorkerZeroSwitchesTheModeAndOnlyBeforeTheFirstInit) {
  ServerJob job(2, host());
  auto mode = header(msg::kCommand, static_cast<uint64_t>(Command::kSetMode), 0, 0);
  const std::string async = "async";
  auto text = std::as_bytes(std::span(async.data(), async.size()));
  EXPECT_EQ(job.wait(1, job.send(1, mode, text)).code(), ErrorCode::kInvalidArgument);
  std::vector<float> init(4, 1.0f);
  auto id = job.send(0, header(msg::kInit, 3, 0, 4), encode_init("w", bytes_of(init)));
  EXPECT_EQ(job.wait(0, id).type, msg::kReply);
  // Switching now would drop every key.
  EXPECT_EQ(job.wait(0, job.send(0, mode, text)).code(), ErrorCode::kInvalidArgument);
  Answer a = job.wait(0, job.send(0, header(msg::kPull, 3, 0, 4)));
  EXPECT_EQ(a.type, msg::kReply);
  EXPECT_EQ(a.payload.size(), 16u);
}

TEST_P(ServerOn, TearDownWhilePushesArrive) {
  // A Server destroyed while its node's I/O thread delivers requests (a job
  // failing) must not free the store under a delivery.
  for (int iter = 0; iter < 8; ++iter) {
    ServerJob job(2, host());
    std::vector<float> init(256, 0.0f), g(256, 1.0f);
    auto id = job.send(0, header(msg::kInit, 5, 0, 256), encode_init("w", bytes_of(init)));
    ASSERT_EQ(job.wait(0, id).type, msg::kReply);
    std::atomic<bool> stop{false};
    std::vector<std::thread> senders;
    for (int w = 0; w < 2; ++w)
      senders.emplace_back([&, w] {
        for (int i = 0; i < 4000 && !stop; ++i) {
          job.send(w, header(i % 3 == 2 ? msg::kPull : msg::kPush, 5, 0, 256),
                   i % 3 == 2 ? std::span<const std::byte>() : bytes_of(g));
          if (i % 64 == 0) std::this_thread::yield();
        }
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + 3 * iter));
    job.destroy_server();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // more deliveries after it
    stop = true;
    for (auto& t : senders)
      t.join();
  }
}

}  // namespace
}  // namespace pushpull::ps
