// SPDX-License-Identifier: Apache-2.0
// ServerStore replication and duplicate drop (docs/ps.md, "Fault
// tolerance"), driven directly: a round's result must reach the backups
// before any worker sees it; a backup that installed the primary's states
// serves on as the primary; a push re-sent after a fail-over is not counted
// twice. Also the replica-chain arithmetic and the placement codec.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>

#include "cluster/protocol.h"
#include "ps/protocol.h"
#include "ps/server_store.h"
#include "pushpull/optimizer.h"

namespace pushpull::ps {
namespace {

using namespace std::chrono_literals;

// Records replies; holds every replication until release() (a slow backup).
class HoldingResponder : public ServerResponder {
 public:
  void reply(const RequestMeta& to, const Status& s, DType, std::span<const std::byte> data,
             std::shared_ptr<void>) override {
    std::lock_guard lock(mu_);
    replies_[to.request_id] = {s, {data.begin(), data.end()}};
    cv_.notify_all();
  }
  bool replicate(const PartId&, std::shared_ptr<const ReplicaState> state,
                 std::function<void()> done) override {
    std::lock_guard lock(mu_);
    states_.push_back(*state);
    held_.push_back(std::move(done));
    cv_.notify_all();
    return true;
  }
  // Waits until `n` replications were asked for, then lets them complete.
  void release(size_t n) {
    std::vector<std::function<void()>> go;
    {
      std::unique_lock lock(mu_);
      ASSERT_TRUE(cv_.wait_for(lock, 5s, [&] { return states_.size() >= n; }));
      go.swap(held_);
    }
    for (auto& f : go)
      f();
  }
  bool wait_reply(uint64_t id, std::chrono::milliseconds t = 5s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, t, [&] { return replies_.count(id) > 0; });
  }
  bool has(uint64_t id) {
    std::lock_guard lock(mu_);
    return replies_.count(id) > 0;
  }
  std::pair<Status, std::vector<float>> get(uint64_t id) {
    std::lock_guard lock(mu_);
    auto& r = replies_.at(id);
    std::vector<float> f(r.second.size() / 4);
    if (!f.empty()) std::memcpy(f.data(), r.second.data(), f.size() * 4);  // empty: no pointer
    return {r.first, f};
  }
  ReplicaState state(size_t i) {
    std::lock_guard lock(mu_);
    return states_.at(i);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::pair<Status, std::vector<std::byte>>> replies_;
  std::vector<ReplicaState> states_;
  std::vector<std::function<void()>> held_;
};

Payload floats(std::vector<float> v) {
  auto a = std::make_shared<Array>(Shape{static_cast<int64_t>(v.size())}, DType::kFloat32);
  std::memcpy(a->data(), v.data(), v.size() * 4);
  return Payload{a->view(), a};
}

ServerStoreConfig replicated(int workers, bool sync) {
  ServerStoreConfig c{workers, sync, 2, 0};
  c.replicate = true;
  return c;
}

const PartId kPart{7, 0};

TEST(Replication, ARoundIsNeitherAcknowledgedNorPulledBeforeItsBackupsHaveIt) {
  HoldingResponder r;
  ServerStore store(replicated(2, true), r);
  store.init({0, 1}, kPart, "w", floats({1, 1}), 0);
  EXPECT_FALSE(r.wait_reply(1, 100ms)) << "init answered before it was replicated";
  r.release(1);
  ASSERT_TRUE(r.wait_reply(1));
  store.push({0, 2}, kPart, floats({1, 2}), false, 1);
  store.push({1, 3}, kPart, floats({3, 4}), false, 1);
  store.pull({0, 4}, kPart, {});
  // The round is applied on this server but waits for its backup.
  EXPECT_FALSE(r.wait_reply(2, 200ms));
  EXPECT_FALSE(r.has(3));
  EXPECT_FALSE(r.has(4)) << "a pull saw a value its backups do not have";
  r.release(2);
  ASSERT_TRUE(r.wait_reply(4));
  EXPECT_TRUE(r.get(2).first.is_ok());
  EXPECT_TRUE(r.get(3).first.is_ok());
  EXPECT_EQ(r.get(4).second, (std::vector<float>{4, 6}));
  ReplicaState s = r.state(1);
  EXPECT_EQ(s.name, "w");
  EXPECT_EQ(s.home, 0);
  EXPECT_EQ(s.applied_seq, (std::vector<uint64_t>{1, 1}));
  EXPECT_EQ(s.value.view.as<float>()[1], 6.0f);
}

// A push held while its round was being replicated, and refused when the
// round finished (here: a malformed compressed push), must not strand a pull
// the same worker sent after it: the pull waited for that push to finish,
// and the error is how it finished.
TEST(Replication, APullAfterAHeldPushThatFailsIsAnswered) {
  HoldingResponder r;
  ServerStore store(replicated(1, true), r);
  store.init({0, 1}, kPart, "w", floats({1, 1}), 0);
  r.release(1);
  ASSERT_TRUE(r.wait_reply(1));
  store.push({0, 2}, kPart, floats({2, 3}), false, 1);  // round 1: replicating
  auto junk = std::make_shared<std::vector<std::byte>>(3, std::byte{0xff});
  Payload bad{ArrayView(junk->data(), DType::kUInt8, Shape{3}), junk};
  store.push({0, 3}, kPart, bad, true, 2);  // held behind the replication
  store.pull({0, 4}, kPart, {});            // waits for both pushes
  EXPECT_FALSE(r.wait_reply(4, 100ms));
  r.release(2);
  ASSERT_TRUE(r.wait_reply(3));
  EXPECT_FALSE(r.get(3).first.is_ok()) << "a malformed compressed push was accepted";
  ASSERT_TRUE(r.wait_reply(4)) << "the pull after the refused push was never answered";
  EXPECT_TRUE(r.get(4).first.is_ok());
  EXPECT_EQ(r.get(4).second, (std::vector<float>{2, 3}));
  EXPECT_TRUE(r.get(2).first.is_ok());
}

TEST(Replication, APromotedBackupContinuesAndDropsReSentPushes) {
  // The primary: two rounds with the `test` optimizer, replicated.
  HoldingResponder primary_r;
  ServerStore primary(replicated(2, true), primary_r);
  auto spec = OptimizerSpec::parse("test:rescale_grad=1");
  primary.set_optimizer({0, 100}, spec);
  primary.init({0, 1}, kPart, "w", floats({1, 1}), 0);
  primary_r.release(1);
  for (uint64_t round = 1; round <= 2; ++round) {
    primary.push({0, 10 * round}, kPart, floats({1, 1}), false, static_cast<uint32_t>(round));
    primary.push({1, 10 * round + 1}, kPart, floats({2, 2}), false, static_cast<uint32_t>(round));
    primary_r.release(round + 1);
    ASSERT_TRUE(primary_r.wait_reply(10 * round + 1));
  }
  ReplicaState last = primary_r.state(2);

  // The backup installs the last state, then serves as the primary.
  HoldingResponder backup_r;
  ServerStoreConfig config{2, true, 2, 1};
  ServerStore backup(config, backup_r);
  backup.set_optimizer({0, 100}, spec);
  ASSERT_TRUE(backup_r.wait_reply(100));
  Status installed = Status(ErrorCode::kInternal, "not run");
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  backup.install_replica(kPart, last, [&](const Status& s) {
    std::lock_guard lock(mu);
    installed = s;
    done = true;
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 5s, [&] { return done; }));
  }
  ASSERT_TRUE(installed.is_ok()) << installed.to_string();
  // Worker 1 never saw round 2's acknowledgement: it re-sends push 2,
  // which is dropped (acknowledged, not counted); then both push round 3.
  backup.push({1, 50}, kPart, floats({2, 2}), false, 2);
  ASSERT_TRUE(backup_r.wait_reply(50));
  EXPECT_TRUE(backup_r.get(50).first.is_ok());
  backup.push({0, 51}, kPart, floats({1, 1}), false, 3);
  backup.push({1, 52}, kPart, floats({2, 2}), false, 3);
  backup.pull({0, 53}, kPart, {});
  ASSERT_TRUE(backup_r.wait_reply(53));
  // 1 + 3 rounds of (1 + 2): exactly 10.
  EXPECT_EQ(backup_r.get(53).second, (std::vector<float>{10, 10}));
  // A push that is in this round already is refused, not counted.
  backup.push({0, 60}, kPart, floats({1, 1}), false, 4);
  backup.push({0, 61}, kPart, floats({1, 1}), false, 4);
  ASSERT_TRUE(backup_r.wait_reply(61));
  EXPECT_EQ(backup_r.get(61).first.code(), ErrorCode::kProtocolError);
}

TEST(Replication, AnUpdateOfAHeldValueGoesIntoTheRoundsSumNotACopy) {
  // Every replicated state stays held (as a same-host backup holds its
  // primary's value in place): the optimizer must not write those values,
  // and instead of copying one before each update it writes the update
  // into the round's sum, the pushed buffer itself with one worker.
  HoldingResponder r;
  ServerStore store(replicated(1, true), r);
  store.set_optimizer({0, 100}, OptimizerSpec::parse("sgd:learning_rate=0.5,momentum=0.5"));
  ASSERT_TRUE(r.wait_reply(100));
  store.init({0, 1}, kPart, "w", floats({1, 2}), 0);
  r.release(1);
  ASSERT_TRUE(r.wait_reply(1));
  // In float: m = 0.5 m - 0.5 g; w += m. With g = 2 each round:
  // m = -1, -1.5, -1.75; w0 = 0, -1.5, -3.25 (w1 = w0 + 1).
  const std::vector<std::vector<float>> want = {{0, 1}, {-1.5f, -0.5f}, {-3.25f, -2.25f}};
  std::vector<const void*> pushed;
  for (uint32_t round = 1; round <= 3; ++round) {
    Payload g = floats({2, 2});
    pushed.push_back(g.view.data);
    store.push({0, 10 * round}, kPart, std::move(g), false, round);
    r.release(round + 1);
    ASSERT_TRUE(r.wait_reply(10 * round));
  }
  for (size_t i = 0; i < 3; ++i) {
    ReplicaState s = r.state(i + 1);
    const float* v = s.value.view.as<float>();
    EXPECT_EQ((std::vector<float>{v[0], v[1]}), want[i]) << "round " << i + 1 << " changed";
    EXPECT_EQ(s.value.view.data, pushed[i]) << "round " << i + 1 << " was a copy";
  }
  store.pull({0, 50}, kPart, {});
  ASSERT_TRUE(r.wait_reply(50));
  EXPECT_EQ(r.get(50).second, want.back());
}

TEST(Replication, AReSentInitOfAReplicatedKeyIsAcknowledged) {
  HoldingResponder r;
  ServerStore store(ServerStoreConfig{1, true, 1, 1}, r);
  ReplicaState s;
  s.name = "w";
  s.home = 0;
  s.value = floats({5});
  s.applied_seq = {0};
  store.install_replica(kPart, s, [](const Status&) {});
  store.init({0, 1}, kPart, "w", floats({1}), 0);
  ASSERT_TRUE(r.wait_reply(1));
  EXPECT_TRUE(r.get(1).first.is_ok());
  store.pull({0, 2}, kPart, {});
  ASSERT_TRUE(r.wait_reply(2));
  EXPECT_EQ(r.get(2).second, std::vector<float>{5}) << "the re-sent init replaced the value";
  // Another name with the same id is still a collision.
  store.init({0, 3}, kPart, "other", floats({1}), 0);
  ASSERT_TRUE(r.wait_reply(3));
  EXPECT_EQ(r.get(3).first.code(), ErrorCode::kAlreadyExists);
}

// R = 2: the primary replicated round k to backup 1 but not to backup 2 and
// died; the workers re-send round k to backup 1 (now the primary), which has
// applied it. Acknowledging at once would leave backup 2 a round behind: if
// backup 1 died next, backup 2 would be promoted and lose round k, silently.
// So the duplicate (and a re-sent init) is acknowledged only once this
// server's own backups hold its state.
TEST(Replication, APromotedBackupRepublishesWhatAWorkerReSendsBeforeAcknowledgingIt) {
  HoldingResponder r;
  ServerStore store(replicated(2, true), r);
  ReplicaState s;
  s.name = "w";
  s.home = 0;
  s.value = floats({7, 8});
  s.applied_seq = {3, 3};  // round 3 applied
  store.install_replica(kPart, s, [](const Status&) {});
  store.push({1, 10}, kPart, floats({2, 2}), false, 3);  // worker 1 re-sends round 3
  EXPECT_FALSE(r.wait_reply(10, 200ms)) << "acknowledged before its backups had round 3";
  r.release(1);
  ASSERT_TRUE(r.wait_reply(10));
  EXPECT_TRUE(r.get(10).first.is_ok());
  ReplicaState sent = r.state(0);
  EXPECT_EQ(sent.applied_seq, (std::vector<uint64_t>{3, 3}));
  EXPECT_EQ(sent.value.view.as<float>()[1], 8.0f);
  // Not counted: round 4 starts from round 3's value.
  store.pull({0, 11}, kPart, {});
  ASSERT_TRUE(r.wait_reply(11));
  EXPECT_EQ(r.get(11).second, (std::vector<float>{7, 8}));
  // The re-sent init: the same.
  store.init({0, 12}, kPart, "w", floats({1, 1}), 0);
  EXPECT_FALSE(r.wait_reply(12, 200ms)) << "a re-sent init acknowledged before its backups had it";
  r.release(2);
  ASSERT_TRUE(r.wait_reply(12));
  EXPECT_TRUE(r.get(12).first.is_ok());
  EXPECT_EQ(r.state(1).value.view.as<float>()[0], 7.0f);
}

TEST(Replication, AReplicaThatDoesNotFitIsRefused) {
  HoldingResponder r;
  ServerStore store(ServerStoreConfig{2, true, 1, 1}, r);
  ReplicaState s;
  s.name = "w";
  s.value = floats({5});
  s.applied_seq = {0};  // one worker; the job has two
  Status got;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  store.install_replica(kPart, s, [&](const Status& st) {
    std::lock_guard lock(mu);
    got = st;
    done = true;
    cv.notify_all();
  });
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 5s, [&] { return done; }));
  EXPECT_EQ(got.code(), ErrorCode::kProtocolError);
}

TEST(Replication, OneKeysOptimizerStatesMoveAlone) {
  auto spec = OptimizerSpec::parse("sgd:learning_rate=0.1,momentum=0.9");
  auto a = create_optimizer(spec), b = create_optimizer(spec);
  Array w = Array::full(Shape{4}, 1.0), g = Array::full(Shape{4}, 1.0);
  a->update(Key(1), w.view(), g.view());
  a->update(Key(2), w.view(), g.view());
  a->update(Key(2), w.view(), g.view());
  b->update(Key(3), w.view(), g.view());
  b->merge_states(a->save_key_states(Key(2)));
  EXPECT_EQ(b->update_count(Key(2)), 2);
  EXPECT_EQ(b->update_count(Key(1)), 0) << "only key 2 was sent";
  EXPECT_EQ(b->update_count(Key(3)), 1) << "merging keeps the other keys";
  std::string none = a->save_key_states(Key(9));
  b->merge_states(none);
  EXPECT_EQ(b->num_keys(), 2u);
  none.back() = static_cast<char>(none.back() ^ 1);
  EXPECT_THROW(b->merge_states(none), IoError) << "checksummed like a state file";
}

TEST(Replication, ChainsAndLostRanges) {
  std::vector<bool> none(3, false), one(3, false), two(3, false);
  one[1] = true;
  two[0] = two[1] = true;
  auto c = cluster::replica_chain(0, 3, 1, none);
  EXPECT_EQ(c.primary, 0);
  EXPECT_EQ(c.backups, std::vector<int>{1});
  c = cluster::replica_chain(1, 3, 1, one);
  EXPECT_EQ(c.primary, 2);
  EXPECT_TRUE(c.backups.empty());
  c = cluster::replica_chain(2, 3, 1, one);
  EXPECT_EQ(c.primary, 2);
  EXPECT_EQ(c.backups, std::vector<int>{0});
  EXPECT_EQ(cluster::first_lost_home(3, 1, one), -1);
  EXPECT_EQ(cluster::first_lost_home(3, 1, two), 0);
  EXPECT_EQ(cluster::first_lost_home(3, 2, two), -1);
  EXPECT_EQ(cluster::ps_replicas(-1, 1), 0);
  EXPECT_EQ(cluster::ps_replicas(-1, 2), 1);
  EXPECT_EQ(cluster::ps_replicas(5, 3), 2);
  EXPECT_EQ(cluster::ps_replicas(0, 3), 0);
}

TEST(Replication, Codecs) {
  cluster::Placement p{3, {false, true, false}, {7, 0, 0}, {false, true, false}}, q;
  ASSERT_TRUE(cluster::decode_placement(cluster::encode_placement(p), &q).is_ok());
  EXPECT_EQ(q.epoch, 3u);
  EXPECT_EQ(q.dead, p.dead);
  EXPECT_EQ(q.late, p.late);
  EXPECT_EQ(q.restarting, p.restarting);
  // A rejoined (late) server comes last in its chains: its return moves no primary.
  EXPECT_EQ(cluster::replica_chain(0, 3, 1, {false, false, false}, {1, 0, 0}).primary, 1);
  EXPECT_EQ(cluster::replica_chain(0, 3, 1, {false, true, false}, {1, 0, 0}).primary, 0);
  // Both servers of a chain rejoined: the later rejoin stays behind the
  // earlier one, whatever their home order (the primary does not move back).
  EXPECT_EQ(cluster::replica_chain(0, 3, 1, {false, false, false}, {2, 1, 0}).primary, 1);
  EXPECT_EQ(cluster::replica_chain(0, 3, 1, {false, false, false}, {1, 2, 0}).primary, 0);
  EXPECT_EQ(cluster::replica_chain(0, 3, 2, {false, false, false}, {3, 0, 2}).backups,
            (std::vector<int>{2, 0}));
  auto bytes = cluster::encode_placement(p);
  bytes.pop_back();
  EXPECT_FALSE(cluster::decode_placement(bytes, &q).is_ok());

  ReplicaState s, t;
  s.name = "w";
  s.home = 2;
  s.applied_seq = {4, 5};
  s.optimizer_states = "abc";
  auto m = encode_replica_meta(s);
  ASSERT_TRUE(decode_replica_meta(m, 2, &t).is_ok());
  EXPECT_EQ(t.name, "w");
  EXPECT_EQ(t.home, 2);
  EXPECT_EQ(t.applied_seq, s.applied_seq);
  EXPECT_EQ(t.optimizer_states, "abc");
  EXPECT_FALSE(decode_replica_meta(m, 1, &t).is_ok()) << "more workers than the job has";
  m.pop_back();
  EXPECT_FALSE(decode_replica_meta(m, 2, &t).is_ok());

  EXPECT_EQ(unwrap_seq(5, 4), 5u);
  EXPECT_EQ(unwrap_seq(1, kWrap - 1), kWrap + 1);
  EXPECT_EQ(unwrap_seq(static_cast<uint32_t>(kWrap - 1), kWrap + 2), kWrap - 1);
  EXPECT_EQ(seq_of_dtype(dtype_field(1, kWrap + 7)), 7u);
  EXPECT_EQ(epoch_of_flags(epoch_flags(9) | 1), 9u);
}

}  // namespace
}  // namespace pushpull::ps
