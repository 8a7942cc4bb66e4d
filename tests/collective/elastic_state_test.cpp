// SPDX-License-Identifier: Apache-2.0
// The elastic state machine (include/pushpull/elastic.h): the order of
// commit / restore / sync / reset callbacks, which errors re-form and which
// end the loop, host-change agreement, and whole groups of threads over the
// in-process transport that lose a member (and gain one) mid-training.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "collective/elastic_group.h"
#include "pushpull/elastic.h"
#include "transport/inproc/inprocess_transport.h"

namespace pushpull::collective::elastic {

using transport::InProcessFabric;

namespace {

using testing::ElasticHub;

// Records what the loop calls, in order.
class RecordingState : public State {
 public:
  RecordingState(CommunicatorFn comm, std::vector<std::string>* log)
      : State(std::move(comm)), log_(log) {}
  void save() override { log_->push_back("save"); }
  void restore() override { log_->push_back("restore"); }
  void sync() override { log_->push_back("sync"); }

 private:
  std::vector<std::string>* log_;
};

std::unique_ptr<Communicator> world_of_one() {
  InProcessFabric fabric(1);
  return std::make_unique<Communicator>(fabric.endpoint(0), CommunicatorOptions{});
}

TEST(ElasticState, FailureRestoresThenResetsThenCallbacksThenSyncs) {
  auto comm = world_of_one();
  std::vector<std::string> log;
  RecordingState state([&]() -> Communicator& { return *comm; }, &log);
  state.register_reset_callbacks({[&] { log.push_back("cb1"); }});
  state.register_reset_callbacks({[&] { log.push_back("cb2"); }});
  int calls = 0;
  run(
      state,
      [&] {
        log.push_back("fn");
        if (++calls == 1) throw PeerFailure("rank 3 died");
        if (calls == 2) throw HostsUpdatedInterrupt(false);
        if (calls == 3) throw HostsUpdatedInterrupt(true);
      },
      [&] { log.push_back("reset"); });
  const std::vector<std::string> want = {
      "sync", "fn",    "restore", "reset", "cb1",  "cb2", "sync",  // a member failed
      "fn",   "reset", "cb1",     "cb2",   "sync",                 // hosts changed
      "fn",   "reset", "cb1",     "cb2",                           // ... skip_sync
      "fn"};
  EXPECT_EQ(log, want);
}

// Records the participant's calls into the same log.
class RecordingParticipant : public Participant {
 public:
  explicit RecordingParticipant(std::vector<std::string>* log) : log_(log) {}
  void elastic_save() override { log_->push_back("p.save"); }
  void elastic_abandon() override { log_->push_back("p.abandon"); }
  void elastic_restore() override { log_->push_back("p.restore"); }
  void elastic_rebind() override { log_->push_back("p.rebind"); }
  void elastic_sync() override { log_->push_back("p.sync"); }

 private:
  std::vector<std::string>* log_;
};

TEST(ElasticState, ParticipantsFollowCommitFailureAndHostChange) {
  auto comm = world_of_one();
  std::vector<std::string> log;
  RecordingState state([&]() -> Communicator& { return *comm; }, &log);
  RecordingParticipant p(&log);
  state.add_participant(p);
  state.add_participant(p);  // once only
  state.register_reset_callbacks({[&] { log.push_back("cb"); }});
  int calls = 0;
  run(
      state,
      [&] {
        log.push_back("fn");
        if (++calls == 1) {
          state.commit();
          throw PeerFailure("rank 3 died");
        }
        if (calls == 2) throw HostsUpdatedInterrupt(true);
      },
      [&] { log.push_back("reset"); });
  // A commit, then a failure; then a host change with skip_sync (the
  // participant still syncs).
  const std::vector<std::string> want = {
      "sync",      "p.sync", "fn",       "save", "p.save", "p.abandon", "restore",
      "p.restore", "reset",  "p.rebind", "cb",   "sync",   "p.sync",    "fn",
      "p.abandon", "reset",  "p.rebind", "cb",   "p.sync", "fn"};
  EXPECT_EQ(log, want);
  state.remove_participant(p);
  log.clear();
  state.commit();
  EXPECT_EQ(log, (std::vector<std::string>{"save"}));
}

TEST(ElasticState, OtherErrorsEndTheLoopWithoutRestoring) {
  auto comm = world_of_one();
  std::vector<std::string> log;
  RecordingState state([&]() -> Communicator& { return *comm; }, &log);
  EXPECT_THROW(
      run(
          state, [] { throw InvalidArgument("bad shape"); }, [&] { log.push_back("reset"); }),
      InvalidArgument);
  EXPECT_EQ(log, (std::vector<std::string>{"sync"}));
}

TEST(ElasticState, AFailedResetIsRetriedARefusalEndsTheLoop) {
  auto comm = world_of_one();
  std::vector<std::string> log;
  RecordingState state([&]() -> Communicator& { return *comm; }, &log);
  int resets = 0;
  int calls = 0;
  run(
      state,
      [&] {
        if (++calls == 1) throw PeerFailure("x");
      },
      [&] {
        if (++resets < 3) throw PeerFailure("a member died while re-forming");
      });
  EXPECT_EQ(resets, 3);
  EXPECT_EQ(calls, 2);
  EXPECT_THROW(run(
                   state, [] { throw PeerFailure("x"); },
                   [] { throw Internal("fewer than --min-workers"); }),
               Internal);
  // A group that keeps failing ends at max_resets with a PeerFailure.
  EXPECT_THROW(run(
                   state, [] { throw PeerFailure("x"); }, [] {}, 3),
               PeerFailure);
}

TEST(ElasticState, CommitSavesThenEveryRankRaisesAtTheSameCommit) {
  constexpr int n = 4;
  ElasticHub hub(n);
  std::vector<int> raised_at(n, -1);
  std::vector<std::thread> threads;
  for (int id = 0; id < n; ++id)
    threads.emplace_back([&, id] {
      auto comm = hub.join(id);
      std::vector<std::string> log;
      RecordingState state([&]() -> Communicator& { return *comm; }, &log);
      for (int step = 0; step < 6; ++step) {
        // Only rank 2 hears of the change, at step 3.
        if (id == 2 && step == 3) state.on_hosts_updated(7);
        try {
          state.commit();
        } catch (const HostsUpdatedInterrupt&) {
          raised_at[id] = step;
        }
      }
      EXPECT_EQ(log.size(), 6u);  // every commit saved first
      comm->shutdown();
    });
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(raised_at, std::vector<int>(n, 3));
}

// Training: w += allreduce(g) with g = 1 per rank, a commit every 2 steps.
struct Trainer {
  std::vector<float> w = std::vector<float>(16, 0.f);
  int64_t step = 0;
  int64_t sizes_sum = 0;  // sum of size() over the steps: proves who took part
};

void train(int id, ElasticHub& hub, int die_at, int steps, std::atomic<int>* resets,
           std::vector<Trainer>* out, std::vector<int>* final_size) {
  std::unique_ptr<Communicator> comm = hub.join(id);
  Trainer t;
  BufferState state([&]() -> Communicator& { return *comm; });
  state.add("w", t.w.data(), t.w.size() * sizeof(float));
  state.add_value("step", &t.step);
  state.add_value("sizes", &t.sizes_sum);
  state.register_reset_callbacks({[&] { resets->fetch_add(1); }});
  try {
    run(
        state,
        [&] {
          for (; t.step < steps;) {
            if (t.step == die_at) {
              hub.leave();
              comm->shutdown();  // the in-process transport's death
              throw std::runtime_error("died");
            }
            std::vector<float> g(t.w.size(), 1.f);
            comm->allreduce("grad", ArrayView(g.data(), DType::kFloat32,
                                              Shape{static_cast<int64_t>(g.size())}));
            for (size_t i = 0; i < g.size(); ++i)
              t.w[i] += g[i];
            t.sizes_sum += comm->size();
            ++t.step;
            if (t.step % 2 == 0) state.commit();
          }
        },
        [&] {
          comm->shutdown();
          comm = hub.join(id);
        });
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()) != "died") throw;
    return;
  }
  (*out)[id] = t;
  (*final_size)[id] = comm->size();
  comm->shutdown();
}

TEST(ElasticGroup, AMemberDiesTheSurvivorsRestoreReformAndFinishWithThree) {
  constexpr int n = 4, steps = 12;
  ElasticHub hub(n);
  std::atomic<int> resets{0};
  std::vector<Trainer> out(n);
  std::vector<int> final_size(n, 0);
  std::vector<std::thread> threads;
  for (int id = 0; id < n; ++id)
    threads.emplace_back(train, id, std::ref(hub), id == 3 ? 5 : -1, steps, &resets, &out,
                         &final_size);
  for (auto& t : threads)
    t.join();
  EXPECT_GE(hub.round(), 2u);
  for (int id = 0; id < 3; ++id) {
    SCOPED_TRACE(id);
    EXPECT_EQ(final_size[id], 3);
    EXPECT_EQ(out[id].step, steps);
    EXPECT_GE(resets.load(), 3);
    // Steps 0..3 with 4 ranks (committed at 4); the uncommitted step 4 was
    // undone and redone with 3 ranks, as were the steps after it.
    EXPECT_EQ(out[id].sizes_sum, 4 * 4 + 3 * (steps - 4));
    EXPECT_EQ(out[id].w, out[0].w);
    EXPECT_FLOAT_EQ(out[id].w[0], 4.f * 4 + 3.f * (steps - 4));
  }
}

TEST(ElasticGroup, AFreshMemberGetsRankZerosCommittedStateAtTheNextRound) {
  constexpr int n = 2;
  ElasticHub hub(n);
  std::atomic<int> resets{0};
  std::vector<Trainer> out(3);
  std::vector<int> final_size(3, 0);
  std::vector<std::thread> threads;
  // Two members train; a third arrives, the members re-form at a commit
  // (a host change), and the newcomer starts from their committed state.
  std::atomic<bool> announced{false};
  for (int id = 0; id < n; ++id)
    threads.emplace_back([&, id] {
      std::unique_ptr<Communicator> comm = hub.join(id);
      Trainer t;
      BufferState state([&]() -> Communicator& { return *comm; });
      state.add("w", t.w.data(), t.w.size() * sizeof(float));
      state.add_value("step", &t.step);
      run(
          state,
          [&] {
            for (; t.step < 10;) {
              if (t.step == 4 && id == 0 && !announced.exchange(true)) {
                hub.add_member();
                state.on_hosts_updated(1);
              }
              std::vector<float> g(t.w.size(), 1.f);
              comm->allreduce("grad", ArrayView(g.data(), DType::kFloat32,
                                                Shape{static_cast<int64_t>(g.size())}));
              for (size_t i = 0; i < g.size(); ++i)
                t.w[i] += g[i];
              ++t.step;
              if (t.step % 2 == 0) state.commit();
            }
          },
          [&] {
            comm->shutdown();
            comm = hub.join(id);
          });
      out[id] = t;
      final_size[id] = comm->size();
      comm->shutdown();
    });
  std::thread newcomer([&] {
    while (!announced.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::unique_ptr<Communicator> comm = hub.join(2);
    Trainer t;  // all zero
    BufferState state([&]() -> Communicator& { return *comm; });
    state.add("w", t.w.data(), t.w.size() * sizeof(float));
    state.add_value("step", &t.step);
    EXPECT_EQ(comm->rank(), 2);  // newcomers rank after the members
    run(
        state,
        [&] {
          EXPECT_EQ(t.step, 6);  // synced from rank 0 before training
          for (; t.step < 10;) {
            std::vector<float> g(t.w.size(), 1.f);
            comm->allreduce("grad", ArrayView(g.data(), DType::kFloat32,
                                              Shape{static_cast<int64_t>(g.size())}));
            for (size_t i = 0; i < g.size(); ++i)
              t.w[i] += g[i];
            ++t.step;
            if (t.step % 2 == 0) state.commit();
          }
        },
        [&] {
          comm->shutdown();
          comm = hub.join(2);
        });
    out[2] = t;
    final_size[2] = comm->size();
    comm->shutdown();
  });
  for (auto& t : threads)
    t.join();
  newcomer.join();
  for (int id = 0; id < 3; ++id) {
    SCOPED_TRACE(id);
    EXPECT_EQ(final_size[id], 3);
    EXPECT_EQ(out[id].step, 10);
    // 6 steps with 2 members (the change is agreed at the commit of step 6),
    // then 4 with 3.
    EXPECT_FLOAT_EQ(out[id].w[0], 2.f * 6 + 3.f * 4);
  }
}

}  // namespace
}  // namespace pushpull::collective::elastic
