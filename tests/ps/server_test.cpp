// SPDX-License-Identifier: Apache-2.0
// The networked parameter server (ps/server.h) in an in-process cluster:
// crafted requests a worker could send (sizes that overflow, ranges past the
// value, bad dtypes and types, garbage payloads) get error replies and the
// server keeps serving the real workers; and a Server torn down while pushes
// are arriving never touches its destroyed store. A lent replica (transport/shm/lend.h)
// is read only when its reference checks out.
#include "ps/server.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "ps/protocol.h"
#include "support/cluster_harness.h"
#include "transport/shm/lend.h"

namespace pushpull::ps {
namespace {

struct Answer {
  uint16_t type = 0;
  uint32_t flags = 0;
  std::vector<std::byte> payload;
  ErrorCode code() const {
    return type == msg::kError ? static_cast<ErrorCode>(flags) : ErrorCode::kOk;
  }
};

// Collects a worker's PS answers by request id.
class Inbox {
 public:
  void add(transport::Message&& m) {
    std::lock_guard lock(mu_);
    answers_[m.header.request_id] = Answer{
        m.header.type, m.header.flags, {m.payload.data(), m.payload.data() + m.payload.size()}};
    cv_.notify_all();
  }
  Answer wait(uint64_t id) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return answers_.count(id) > 0; })) {
      ADD_FAILURE() << "no answer to request " << id;
      return {};
    }
    return answers_[id];
  }
  bool has(uint64_t id) {
    std::lock_guard lock(mu_);
    return answers_.count(id) > 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Answer> answers_;
};

// A cluster of 1 server (running a Server) and `workers` bare worker nodes
// that speak the PS protocol by hand.
class ServerJob {
 public:
  explicit ServerJob(int workers) : inboxes_(static_cast<size_t>(workers)) {
    test::InProcessCluster::Config c;
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

std::span<const std::byte> bytes_of(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}

transport::Header header(uint16_t type, uint64_t key, uint64_t begin, uint64_t count,
                         DType dtype = DType::kFloat32) {
  transport::Header h;
  h.type = type;
  h.key = key;
  h.offset = begin;
  h.length = count;
  h.dtype = static_cast<uint32_t>(dtype);
  return h;
}

TEST(Server, CraftedRequestsGetErrorsAndTheRealWorkersAreStillServed) {
  ServerJob job(2);
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

TEST(Server, OnlyWorkerZeroSwitchesTheModeAndOnlyBeforeTheFirstInit) {
  ServerJob job(2);
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

TEST(Server, TearDownWhilePushesArrive) {
  // A Server destroyed while its node's I/O thread delivers requests (a job
  // failing) must not free the store under a delivery.
  for (int iter = 0; iter < 8; ++iter) {
    ServerJob job(2);
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

// A real Server next to a bare "server" node that plays its peer by hand:
// it sends replicas (meta, then a lent value) and acknowledges the real
// server's own replicas so that its rounds complete.
class ReplicaPeerJob {
 public:
  ReplicaPeerJob() {
    test::InProcessCluster::Config c;
    c.servers = 2;
    c.workers = 1;
    c.setup = [this](cluster::Node& n) {
      if (n.role() == Role::kWorker) {
        n.set_handler(msg::kFirst, msg::kLast,
                      [this](transport::Message&& m) { worker_inbox_.add(std::move(m)); });
        return;
      }
      if (!server_) {
        server_ = std::make_unique<Server>(n);
        return;
      }
      peer_ = &n;
      n.set_handler(msg::kFirst, msg::kLast, [this, &n](transport::Message&& m) {
        if (m.header.type == msg::kReplicaValue) {  // the real server's replica: installed
          transport::Header ack{.type = msg::kReply, .request_id = m.header.request_id};
          transport::LendRef ref;
          std::span<const std::byte> body{m.payload.data(), m.payload.size()};
          if (m.header.flags & msg::kFlagWithMeta) {  // the metadata behind the reference
            EXPECT_GT(body.size(), transport::kLendRefBytes);
            body = body.first(std::min(body.size(), transport::kLendRefBytes));
          }
          // Lent: held in place, as a real backup does, until release().
          if ((m.header.flags & msg::kFlagLent) && transport::decode_lend_ref(body, &ref).is_ok()) {
            ack.flags = msg::kFlagPinned;
            std::lock_guard lock(mu_);
            pinned_.push_back({m.conn, m.header.request_id, m.header.key, ref});
          }
          n.transport().send_copy(m.conn, ack, nullptr, 0);
          return;
        }
        if (m.header.type == msg::kReplicaMeta) return;
        (m.header.type == msg::kReplicaRelease ? releases_ : inbox_).add(std::move(m));
      });
    };
    cluster_ = std::make_unique<test::InProcessCluster>(c);
  }
  ~ReplicaPeerJob() {
    server_.reset();
    cluster_.reset();
  }
  int real_rank() const { return 1 - peer_->rank(); }
  // Sends a replica of `count` float32 elements of `key` whose value message
  // carries `value` with `flags`; returns the answer to it.
  Answer replicate(uint64_t key, uint64_t count, uint32_t flags, std::vector<std::byte> value) {
    const uint64_t id = ++next_id_;
    ReplicaState st;
    st.name = "lent" + std::to_string(key);
    st.home = peer_->rank();
    st.applied_seq.assign(1, 0);
    transport::Header h = header(msg::kReplicaMeta, key, 0, count);
    h.request_id = id;
    auto meta = encode_replica_meta(st);
    EXPECT_TRUE(peer_->send_copy(Role::kServer, real_rank(), h, meta.data(), meta.size()).is_ok());
    h.type = msg::kReplicaValue;
    h.flags = flags;
    EXPECT_TRUE(
        peer_->send_copy(Role::kServer, real_rank(), h, value.data(), value.size()).is_ok());
    return inbox_.wait(id);
  }
  // The same replica in one message (kFlagLent | kFlagWithMeta): `ref`'s
  // bytes, then the metadata (or `meta` instead when given).
  Answer replicate_in_one(uint64_t key, uint64_t count, uint32_t flags, std::vector<std::byte> ref,
                          std::optional<std::vector<std::byte>> meta = std::nullopt) {
    const uint64_t id = ++next_id_;
    ReplicaState st;
    st.name = "one" + std::to_string(key);
    st.home = peer_->rank();
    st.applied_seq.assign(1, 0);
    std::vector<std::byte> payload = std::move(ref);
    std::vector<std::byte> m = meta ? *meta : encode_replica_meta(st);
    payload.insert(payload.end(), m.begin(), m.end());
    transport::Header h = header(msg::kReplicaValue, key, 0, count);
    h.request_id = id;
    h.flags = flags;
    EXPECT_TRUE(
        peer_->send_copy(Role::kServer, real_rank(), h, payload.data(), payload.size()).is_ok());
    return inbox_.wait(id);
  }
  // The real server's kReplicaRelease of the replica sent as request `id`.
  Answer release_of(uint64_t id) { return releases_.wait(id); }
  bool released(uint64_t id) { return releases_.has(id); }

  // The worker's request to the real server, and its answer.
  uint64_t worker_send(transport::Header h, std::span<const std::byte> payload) {
    h.request_id = ++next_id_;
    EXPECT_TRUE(cluster_->worker(0)
                    .send_copy(Role::kServer, real_rank(), h, payload.data(), payload.size())
                    .is_ok());
    return h.request_id;
  }
  Answer worker_wait(uint64_t id) { return worker_inbox_.wait(id); }

  // The real server's replicas that this peer holds in place, in order.
  struct Pin {
    transport::ConnId conn;
    uint64_t id, key;
    transport::LendRef ref;
  };
  std::vector<Pin> pinned() {
    std::lock_guard lock(mu_);
    return pinned_;
  }
  // The peer server dies: its connections close, the scheduler fails it over.
  void kill_peer() { peer_->stop_delivery(); }
  Server& real_server() { return *server_; }
  // Tells the real server this peer let go of `p`.
  void release(const Pin& p) {
    transport::Header h{.type = msg::kReplicaRelease, .request_id = p.id, .key = p.key};
    auto bytes = transport::encode_lend_ref(p.ref);
    EXPECT_TRUE(peer_->transport().send_copy(p.conn, h, bytes.data(), bytes.size()).is_ok());
  }

 private:
  std::unique_ptr<Server> server_;
  cluster::Node* peer_ = nullptr;
  Inbox inbox_;
  Inbox releases_;
  Inbox worker_inbox_;
  std::mutex mu_;
  std::vector<Pin> pinned_;
  std::unique_ptr<test::InProcessCluster> cluster_;
  uint64_t next_id_ = 1000;
};

// A zeroed 1 MiB block to lend from.
std::unique_ptr<transport::LendBlock> zeroed_block() {
  std::unique_ptr<transport::LendBlock> block;
  Status st = transport::LendBlock::create(1 << 20, &block);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  if (block) std::memset(block->data(), 0, block->size());
  return block;
}

TEST(Server, ALentReplicaIsHeldInPlaceWhenItsReferenceChecksOut) {
  ReplicaPeerJob job;
  auto block = zeroed_block();
  ASSERT_TRUE(block);
  const uint64_t n = 1000;
  transport::LendRef ref = *block->ref(block->data() + 4096, n * 4);

  // A good reference: held in place (pinned), installed, acknowledged.
  Answer ok = job.replicate(1, n, msg::kFlagLent, transport::encode_lend_ref(ref));
  EXPECT_EQ(ok.type, msg::kReply);
  EXPECT_EQ(ok.flags, msg::kFlagPinned);
  // The next round of that key replaces it: the first range is released
  // (named by its reference), the second one stays held.
  transport::LendRef next = *block->ref(block->data() + 8192, n * 4);
  Answer ok2 = job.replicate(1, n, msg::kFlagLent, transport::encode_lend_ref(next));
  EXPECT_EQ(ok2.flags, msg::kFlagPinned);
  Answer released = job.release_of(1001);
  EXPECT_EQ(released.type, msg::kReplicaRelease);
  transport::LendRef named;
  ASSERT_TRUE(transport::decode_lend_ref(released.payload, &named).is_ok());
  EXPECT_EQ(named, ref);
  EXPECT_FALSE(job.released(1002));
  // A token that is not the block's: not read; the primary is asked for bytes.
  transport::LendRef forged = ref;
  forged.token[0] ^= std::byte{0xff};
  Answer bytes = job.replicate(2, n, msg::kFlagLent, transport::encode_lend_ref(forged));
  EXPECT_EQ(bytes.type, msg::kReply);
  EXPECT_EQ(bytes.flags, msg::kFlagSendBytes);
  // A range that is not the value's size, a reference that does not decode,
  // and one that would make the backup allocate past the message limit
  // (2^42 bytes, inside a block that large): refused, nothing allocated.
  transport::LendRef wrong = ref;
  wrong.bytes -= 4;
  EXPECT_EQ(job.replicate(3, n, msg::kFlagLent, transport::encode_lend_ref(wrong)).type,
            msg::kError);
  EXPECT_EQ(job.replicate(4, n, msg::kFlagLent, std::vector<std::byte>(7)).type, msg::kError);
  transport::LendRef huge = ref;
  huge.block_bytes = huge.bytes = uint64_t{1} << 42;
  huge.offset = 0;
  EXPECT_EQ(
      job.replicate(5, uint64_t{1} << 40, msg::kFlagLent, transport::encode_lend_ref(huge)).type,
      msg::kError);
  // The same replica by value still installs.
  std::vector<std::byte> value(n * 4, std::byte{0});
  Answer by_value = job.replicate(6, n, 0, value);
  EXPECT_EQ(by_value.type, msg::kReply);
  EXPECT_EQ(by_value.flags, 0u);
}

TEST(Server, ALentReplicaWithItsMetadataInOneMessageIsHeldInPlace) {
  // What a same-host primary sends: no kReplicaMeta, the metadata behind the
  // reference in the kReplicaValue.
  ReplicaPeerJob job;
  auto block = zeroed_block();
  ASSERT_TRUE(block);
  const uint64_t n = 1000;
  const uint32_t both = msg::kFlagLent | msg::kFlagWithMeta;
  auto ref = transport::encode_lend_ref(*block->ref(block->data() + 4096, n * 4));
  Answer ok = job.replicate_in_one(1, n, both, ref);
  EXPECT_EQ(ok.type, msg::kReply);
  EXPECT_EQ(ok.flags, msg::kFlagPinned);
  // Metadata without a lent reference, a payload shorter than a reference,
  // and metadata that does not decode: refused with an error (the primary
  // would otherwise wait for this round's acknowledgement forever).
  EXPECT_EQ(job.replicate_in_one(2, n, msg::kFlagWithMeta, ref).type, msg::kError);
  EXPECT_EQ(job.replicate_in_one(3, n, both, {}, std::vector<std::byte>(5)).type, msg::kError);
  EXPECT_EQ(job.replicate_in_one(4, n, both, ref, std::vector<std::byte>(3, std::byte{0xff})).type,
            msg::kError);
  // A reference that is not the value's size is refused as in two messages.
  EXPECT_EQ(job.replicate_in_one(5, n + 1, both, ref).type, msg::kError);
}

TEST(Server, AValueItsBackupHoldsInPlaceIsNotReusedUntilReleased) {
  ReplicaPeerJob job;
  // 400 KB: cut out of the lending pool, so replicated by reference.
  const int64_t n = 100000;
  const uint64_t key = 9;
  std::vector<float> v(n, 0.0f);
  Answer init = job.worker_wait(job.worker_send(
      header(msg::kInit, key, 0, n), encode_init("pinned", bytes_of(v), job.real_rank())));
  ASSERT_EQ(init.type, msg::kReply);
  // No optimizer: each round's sum (the pushed buffer itself, adopted) is the
  // new value, and the old one would go back to the pool at once.
  for (int round = 1; round <= 4; ++round) {
    std::fill(v.begin(), v.end(), static_cast<float>(round));
    ASSERT_EQ(job.worker_wait(job.worker_send(header(msg::kPush, key, 0, n), bytes_of(v))).type,
              msg::kReply);
  }
  auto pinned = job.pinned();
  ASSERT_GE(pinned.size(), 4u);  // every round's value (and the init's, lent too)
  const size_t first = pinned.size() - 4;
  transport::LendReader reader;
  auto holds = [&](const ReplicaPeerJob::Pin& p, float want) {
    std::vector<float> got(static_cast<size_t>(n));
    EXPECT_TRUE(reader.copy(p.ref, got.data()).is_ok());
    return std::count(got.begin(), got.end(), want) == n;
  };
  // Held, none was reused for a later push: each still reads its own round.
  for (size_t i = 0; i < 4; ++i)
    EXPECT_TRUE(holds(pinned[first + i], static_cast<float>(i + 1))) << "round " << i + 1;
  // A release whose reference does not match (an earlier incarnation's, or
  // a confused peer's) frees nothing; then a good one frees exactly one. The
  // releases travel on one connection, in order, so once the good one took
  // effect the bad ones were seen.
  const size_t held = job.real_server().held_by_backups();
  for (const auto& p : pinned) {
    ReplicaPeerJob::Pin wrong = p;
    wrong.ref.offset += 4096;
    job.release(wrong);
    wrong = p;
    wrong.ref.token[0] ^= std::byte{1};
    job.release(wrong);
  }
  job.release(pinned.front());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (job.real_server().held_by_backups() == held && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(job.real_server().held_by_backups(), held - 1) << "a mismatched release freed a pin";
  // Released, their buffers go back to the pool: later pushes land in them.
  // The value still held (round 4's) is never one of them.
  std::set<std::pair<int32_t, uint64_t>> freed;  // (block, offset)
  freed.insert({pinned.front().ref.fd, pinned.front().ref.offset});
  for (size_t i = 1; i + 1 < pinned.size(); ++i) {
    job.release(pinned[i]);
    freed.insert({pinned[i].ref.fd, pinned[i].ref.offset});
  }
  bool reused = false;
  for (int round = 5; round <= 40 && !reused; ++round) {
    std::fill(v.begin(), v.end(), static_cast<float>(round));
    ASSERT_EQ(job.worker_wait(job.worker_send(header(msg::kPush, key, 0, n), bytes_of(v))).type,
              msg::kReply);
    const auto last = job.pinned().back();  // a copy: pinned() returns a temporary
    reused = freed.count({last.ref.fd, last.ref.offset}) > 0;
    EXPECT_TRUE(holds(pinned.back(), 4.0f)) << "round " << round;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(reused) << "no released buffer was used again";
}

TEST(Server, ABackupsDeathReleasesTheValuesItHeld) {
  ReplicaPeerJob job;
  const int64_t n = 100000;  // lent, as above
  std::vector<float> v(n, 1.0f);
  ASSERT_EQ(job.worker_wait(job.worker_send(header(msg::kInit, 9, 0, n),
                                            encode_init("pinned", bytes_of(v), job.real_rank())))
                .type,
            msg::kReply);
  for (int round = 1; round <= 3; ++round)
    ASSERT_EQ(job.worker_wait(job.worker_send(header(msg::kPush, 9, 0, n), bytes_of(v))).type,
              msg::kReply);
  // Never released: every round's value is still held for the backup.
  EXPECT_GE(job.real_server().held_by_backups(), 3u);
  job.kill_peer();
  // Once the placement names it dead, nothing is held for it any more.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (job.real_server().held_by_backups() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(job.real_server().held_by_backups(), 0u);
}

}  // namespace
}  // namespace pushpull::ps
