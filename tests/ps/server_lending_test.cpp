// SPDX-License-Identifier: Apache-2.0
// The networked parameter server (ps/server.h) and lent replicas
// (transport/shm/lend.h): a lent replica is read only when its reference
// checks out, a value a backup holds in place is not reused until released,
// and a backup's death releases what it held.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <set>

#include "ps/protocol.h"
#include "ps/server.h"
#include "server_inbox.h"
#include "support/cluster_harness.h"
#include "transport/shm/lend.h"

namespace pushpull::ps {
namespace {

using namespace server_testing;

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
