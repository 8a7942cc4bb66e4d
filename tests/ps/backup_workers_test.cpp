// SPDX-License-Identifier: Apache-2.0
// Backup workers in dist_sync (docs/ps.md "Backup workers"), driven on the
// store without threads (ServerStoreConfig::threads = 0, run_queued): a round
// closes after N - b pushes with its sum scaled by N / pushes, a late push is
// answered, dropped and counted, a late worker pulls its own round's value,
// several rounds late, the lateness bound, replication of what was marked
// applied, and b >= N refused.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <vector>

#include "ps/protocol.h"
#include "ps/server_store.h"
#include "pushpull/optimizer.h"

namespace pushpull::ps {
namespace {

// Records replies; replications complete only on release() (sans-IO).
class Responder : public ServerResponder {
 public:
  bool replicating = false;
  void reply(const RequestMeta& to, const Status& s, DType, std::span<const std::byte> data,
             std::shared_ptr<void>) override {
    replies[to.request_id] = {s, {data.begin(), data.end()}};
  }
  bool replicate(const PartId&, std::shared_ptr<const ReplicaState> state,
                 std::function<void()> done) override {
    if (!replicating) return false;
    states.push_back(*state);
    held.push_back(std::move(done));
    return true;
  }
  void release() {
    for (auto& f : std::exchange(held, {}))
      f();
  }
  bool has(uint64_t id) const { return replies.count(id) > 0; }
  std::vector<float> value(uint64_t id) {
    EXPECT_TRUE(has(id)) << "no reply to request " << id;
    if (!has(id)) return {};
    auto& r = replies.at(id);
    EXPECT_TRUE(r.first.is_ok()) << r.first.to_string();
    std::vector<float> f(r.second.size() / 4);
    if (!f.empty()) std::memcpy(f.data(), r.second.data(), f.size() * 4);
    return f;
  }
  std::map<uint64_t, std::pair<Status, std::vector<std::byte>>> replies;
  std::vector<ReplicaState> states;
  std::vector<std::function<void()>> held;
};

Payload floats(float v, int64_t n = 3) {
  auto a = std::make_shared<Array>(Array::full(Shape{n}, v));
  return Payload{a->view(), a};
}

const PartId kPart{1, 0};

class BackupWorkers : public ::testing::Test {
 protected:
  void make(int workers, int backup, int max_late = 8) {
    ServerStoreConfig c{workers, true, 0, 0};
    c.backup_workers = backup;
    c.backup_max_late = max_late;
    c.replicate = r_.replicating;
    store_ = std::make_unique<ServerStore>(c, r_);
    uint64_t id = ++id_;
    store_->init({0, id}, kPart, "w", floats(0.0f));
    run();
    r_.release();
    run();
    ASSERT_TRUE(r_.has(id));
  }
  void optimizer(const std::string& spec) {
    uint64_t id = ++id_;
    store_->set_optimizer({0, id}, OptimizerSpec::parse(spec));
    run();
    ASSERT_TRUE(r_.has(id));
  }
  // Worker w's push of its round `seq` (its push count on the part).
  uint64_t push(int w, uint32_t seq, float v, bool pull_back = false) {
    RequestMeta m{w, ++id_};
    m.pull_back = pull_back;
    store_->push(m, kPart, floats(v), false, seq);
    run();
    return m.request_id;
  }
  uint64_t pull(int w) {
    uint64_t id = ++id_;
    store_->pull({w, id}, kPart, {});
    run();
    return id;
  }
  float value_of(uint64_t id) {
    auto v = r_.value(id);
    return v.empty() ? -1.0f : v[0];
  }
  void run() { store_->run_queued(); }

  Responder r_;
  std::unique_ptr<ServerStore> store_;
  uint64_t id_ = 0;
};

TEST_F(BackupWorkers, ARoundClosesAtNMinusBWithItsSumScaled) {
  make(4, 1);
  uint64_t a = push(0, 1, 1.0f), b = push(1, 1, 2.0f);
  EXPECT_FALSE(r_.has(a) || r_.has(b)) << "closed before N - b pushes";
  uint64_t c = push(2, 1, 3.0f);
  ASSERT_TRUE(r_.has(a) && r_.has(b) && r_.has(c));
  // (1 + 2 + 3) * 4 / 3: what 4 pushes give in expectation.
  EXPECT_EQ(value_of(pull(0)), 8.0f);
  EXPECT_EQ(store_->late_pushes_dropped(), 0);
}

TEST_F(BackupWorkers, ALatePushIsAnsweredDroppedAndCountedAndStartsNoRound) {
  make(4, 1);
  for (int w = 0; w < 3; ++w)
    push(w, 1, 1.0f);
  uint64_t late = push(3, 1, 100.0f);
  ASSERT_TRUE(r_.has(late)) << "a late worker would hang";
  EXPECT_TRUE(r_.replies.at(late).first.is_ok());
  EXPECT_EQ(store_->late_pushes_dropped(), 1);
  // It goes on with the round's value, like everyone else.
  EXPECT_EQ(value_of(pull(3)), 4.0f);
  EXPECT_EQ(value_of(pull(0)), 4.0f);
  // The late push opened nothing: round 2 needs three pushes of round 2.
  uint64_t p3 = push(3, 2, 1.0f), p0 = push(0, 2, 2.0f);
  EXPECT_FALSE(r_.has(p3) || r_.has(p0));
  uint64_t p1 = push(1, 2, 3.0f, /*pull_back=*/true);
  ASSERT_TRUE(r_.has(p3) && r_.has(p0));
  EXPECT_EQ(value_of(p1), 8.0f);  // (1 + 2 + 3) * 4 / 3, not added to 4: no optimizer
  // Worker 2 missed round 2: its pull-back push of it gets round 2's value.
  EXPECT_EQ(value_of(push(2, 2, 50.0f, true)), 8.0f);
  EXPECT_EQ(store_->late_pushes_dropped(), 2);
}

TEST_F(BackupWorkers, ALateWorkerSeesEachRoundsValueSeveralRoundsBehind) {
  make(3, 1);
  optimizer("test:rescale_grad=1");  // weight += grad: the value is the running sum
  // Worker 2 is three rounds late: rounds 1..3 close with workers 0 and 1.
  std::vector<float> seen;  // what worker 0 pulled after each round
  for (uint32_t k = 1; k <= 3; ++k) {
    push(0, k, 1.0f);
    push(1, k, 1.0f);
    seen.push_back(value_of(pull(0)));
  }
  EXPECT_EQ(seen, (std::vector<float>{3.0f, 6.0f, 9.0f}));  // 2 * 1.5 per round
  EXPECT_EQ(value_of(pull(2)), 0.0f);  // before its first push: what it saw last
  for (uint32_t k = 1; k <= 3; ++k) {
    EXPECT_EQ(value_of(push(2, k, 7.0f, /*pull_back=*/true)), seen[k - 1]) << "round " << k;
    EXPECT_EQ(value_of(pull(2)), seen[k - 1]) << "round " << k;
  }
  EXPECT_EQ(store_->late_pushes_dropped(), 3);
  // Caught up: its round-4 push counts again; now worker 1 is the late one.
  push(0, 4, 1.0f);
  push(2, 4, 2.0f);
  EXPECT_EQ(value_of(pull(0)), 9.0f + 3.0f * 1.5f);
  EXPECT_EQ(value_of(pull(1)), 9.0f) << "worker 1 is still at round 3";
  EXPECT_EQ(value_of(push(1, 4, 1.0f, true)), 9.0f + 3.0f * 1.5f) << "round 4 closed without it";
}

TEST_F(BackupWorkers, NoWorkerFallsMoreThanMaxLateRoundsBehind) {
  make(3, 1, /*max_late=*/2);
  optimizer("test:rescale_grad=1");
  push(0, 1, 1.0f), push(1, 1, 1.0f);
  push(0, 2, 1.0f), push(1, 2, 1.0f);
  uint64_t a = push(0, 3, 1.0f), b = push(1, 3, 1.0f);
  EXPECT_FALSE(r_.has(a) || r_.has(b)) << "round 3 would put worker 2 three rounds behind";
  EXPECT_EQ(value_of(pull(2)), 0.0f);
  push(2, 1, 5.0f);  // late for round 1: now two behind once round 3 closes
  ASSERT_TRUE(r_.has(a) && r_.has(b));
  EXPECT_EQ(value_of(pull(0)), 9.0f);  // three rounds of 2 * 1.5
  EXPECT_EQ(value_of(pull(2)), 3.0f);  // worker 2 is at round 1
  EXPECT_EQ(store_->late_pushes_dropped(), 1);
}

TEST_F(BackupWorkers, ScaleIsExactWithTheTestOptimizer) {
  make(4, 2);
  optimizer("test:rescale_grad=0.5");
  push(3, 1, 3.0f), push(1, 1, 5.0f);
  // weight += 0.5 * (3 + 5) * 4 / 2
  EXPECT_EQ(value_of(pull(1)), 8.0f);
  EXPECT_EQ(value_of(pull(2)), 0.0f) << "worker 2 missed round 1: it is at round 0";
  push(0, 1, 1.0f), push(2, 1, 1.0f);  // late for round 1
  for (int w = 0; w < 4; ++w)
    push(w, 2, 1.0f);  // workers 2 and 3 late for round 2
  EXPECT_EQ(value_of(pull(0)), 8.0f + 0.5f * 2 * 2) << "round 2 closed at two pushes";
  EXPECT_EQ(store_->late_pushes_dropped(), 4);
}

TEST_F(BackupWorkers, ALatePushDuringReplicationWaitsAndTheReplicaKnowsItWasLate) {
  r_.replicating = true;
  make(3, 1);
  push(0, 1, 1.0f);
  uint64_t b = push(1, 1, 1.0f);
  ASSERT_EQ(r_.states.size(), 2u);  // the init's and round 1's
  EXPECT_EQ(r_.states[1].applied_seq, (std::vector<uint64_t>{1, 1, 1}))
      << "worker 2's round-1 push is marked applied: a promoted backup drops it";
  uint64_t late = push(2, 1, 9.0f);
  EXPECT_FALSE(r_.has(late) || r_.has(b)) << "answered before the backups hold its round";
  r_.release();
  run();
  EXPECT_TRUE(r_.has(b) && r_.has(late));
  EXPECT_EQ(store_->late_pushes_dropped(), 1);

  // A backup with that state, promoted: worker 2's late push (re-sent to
  // it) is acknowledged, not counted.
  Responder br;
  ServerStoreConfig c{3, true, 0, 1};
  c.backup_workers = 1;
  ServerStore backup(c, br);
  bool installed = false;
  backup.install_replica(kPart, r_.states[1], [&](const Status& s) { installed = s.is_ok(); });
  backup.run_queued();
  ASSERT_TRUE(installed);
  backup.push({2, 100}, kPart, floats(9.0f), false, 1);
  backup.push({0, 101}, kPart, floats(1.0f), false, 2);
  backup.run_queued();
  EXPECT_TRUE(br.has(100));
  EXPECT_FALSE(br.has(101)) << "round 2 needs two pushes of round 2";
}

TEST_F(BackupWorkers, APromotedBackupAnswersAWorkerBehindWithItsRoundsValue) {
  r_.replicating = true;
  make(3, 1);
  optimizer("test:rescale_grad=1");
  std::vector<float> seen;  // rounds 1 and 2 close without worker 2
  for (uint32_t k = 1; k <= 2; ++k) {
    push(0, k, 1.0f), push(1, k, 1.0f);
    r_.release();
    run();
    seen.push_back(value_of(pull(0)));
  }
  ASSERT_EQ(r_.states.size(), 3u);  // the init and two rounds
  EXPECT_EQ(r_.states[2].behind, (std::vector<uint64_t>{0, 0, 2}));
  // The backup installs them in order, as the primary sent them; then the
  // primary dies and worker 2 goes on with the backup.
  Responder br;
  ServerStoreConfig c{3, true, 0, 1};
  c.backup_workers = 1;
  ServerStore backup(c, br);
  for (const ReplicaState& st : r_.states)
    backup.install_replica(kPart, st, [](const Status& s) { EXPECT_TRUE(s.is_ok()); });
  backup.run_queued();
  backup.pull({2, 200}, kPart, {});
  backup.run_queued();
  EXPECT_EQ(br.value(200), std::vector<float>(3, 0.0f)) << "worker 2 is at round 0";
  for (uint32_t k = 1; k <= 2; ++k) {
    RequestMeta m{2, 200 + k};
    m.pull_back = true;
    backup.push(m, kPart, floats(5.0f), false, k);
    backup.run_queued();
    EXPECT_EQ(br.value(200 + k), std::vector<float>(3, seen[k - 1])) << "round " << k;
  }
  EXPECT_EQ(backup.late_pushes_dropped(), 2);
}

TEST_F(BackupWorkers, AReplacementOfALateWorkerResumesAfterTheRoundsItMissed) {
  make(3, 1);
  for (uint32_t k = 1; k <= 2; ++k)
    push(0, k, 1.0f), push(1, k, 1.0f);
  // Worker 2 died two rounds behind; its replacement asks for the part.
  uint64_t id = ++id_;
  store_->rejoin({2, id}, kPart);
  run();
  ASSERT_TRUE(r_.has(id));
  uint64_t applied = 0, accepted = 0;
  ASSERT_TRUE(decode_rejoin(r_.replies.at(id).second, &applied, &accepted).is_ok());
  EXPECT_EQ(applied, 2u) << "the rounds closed without it count as done";
  EXPECT_EQ(accepted, 2u);
  // restart_round() = 2: its next push is round 3's, and counts.
  push(2, 3, 4.0f);
  uint64_t p = push(0, 3, 2.0f, true);
  EXPECT_EQ(value_of(p), 9.0f) << "round 3: (4 + 2) * 3 / 2 (no optimizer: the sum is the value)";
  EXPECT_EQ(store_->late_pushes_dropped(), 0);
}

// Worker 0's setting travels to the servers in the mode command.
TEST(BackupWorkersConfig, TheModeCommandAndTheReplicaCarryTheSetting) {
  for (Mode m : {Mode{true, 0, 8}, Mode{false, 0, 8}, Mode{true, 1, 8}, Mode{true, 3, 20}}) {
    Mode back{false, 9, 9};
    ASSERT_TRUE(decode_mode(encode_mode(m), &back).is_ok()) << encode_mode(m);
    EXPECT_EQ(back, m) << encode_mode(m);
  }
  ReplicaState st;
  st.name = "w";
  st.applied_seq = {3, 3, 3};
  st.behind = {0, 0, 2};
  ReplicaState back;
  {
    Status d = decode_replica_meta(encode_replica_meta(st), 3, &back);
    ASSERT_TRUE(d.is_ok()) << d.to_string();
  }
  EXPECT_EQ(back.behind, st.behind);
  st.behind.clear();  // nobody behind: the form without backup workers
  ASSERT_TRUE(decode_replica_meta(encode_replica_meta(st), 3, &back).is_ok());
  EXPECT_TRUE(back.behind.empty());
  auto bytes = encode_replica_meta(st);
  bytes.push_back(std::byte{1});
  EXPECT_FALSE(decode_replica_meta(bytes, 3, &back).is_ok()) << "a truncated tail";
  EXPECT_EQ(encode_mode(Mode{true, 0, 8}), "sync");  // b = 0: the old payload
  EXPECT_EQ(encode_mode(Mode{false, 0, 8}), "async");
  Mode m;
  for (const char* bad :
       {"", "Sync", "sync backup=1", "sync backup=-1 max_late=8", "sync backup=1 max_late=0",
        "sync backup=1 max_late=8 x", "async backup=1 max_late=8"})
    EXPECT_FALSE(decode_mode(bad, &m).is_ok()) << bad;
}

TEST(BackupWorkersConfig, AsManyBackupsAsWorkersIsRefused) {
  Responder r;
  ServerStoreConfig c{2, true, 0, 0};
  c.backup_workers = 2;
  EXPECT_THROW({ ServerStore s(c, r); }, InvalidArgument);
  c.backup_workers = -1;
  EXPECT_THROW({ ServerStore s(c, r); }, InvalidArgument);
  c.backup_workers = 1;
  EXPECT_NO_THROW({ ServerStore s(c, r); });
}

}  // namespace
}  // namespace pushpull::ps
