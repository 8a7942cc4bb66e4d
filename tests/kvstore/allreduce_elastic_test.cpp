// SPDX-License-Identifier: Apache-2.0
// The dist_sync_allreduce KVStore in an elastic group (kvstore/allreduce_store.h,
// pushpull/elastic_kvstore.h): members are threads over the in-process
// transport (tests/collective/elastic_group.h); one dies, the survivors
// re-form, their stores go back to the commit, re-bind, re-sync from the new
// rank 0 and keep summing over the new size; a refusal to re-form ends the
// loop without leaving the store hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collective/elastic_group.h"
#include "kvstore/allreduce_store.h"
#include "pushpull/elastic.h"
#include "pushpull/elastic_kvstore.h"

namespace pushpull {
namespace {

namespace el = collective::elastic;
using collective::Communicator;
using collective::testing::ElasticHub;

constexpr int64_t kLen = 8;

Options store_options() {
  Options o;
  o.kvstore.wait_timeout = Millis(30000);
  o.kvstore.engine_threads = 1;
  return o;
}

float pull0(KVStore& kv, int key) {
  Array out(Shape{kLen}, DType::kFloat32);
  kv.pull(key, out.view());
  return out.as<float>()[0];
}

// stored += the workers' sum (every worker alike).
void add_updater(KVStore& kv) {
  kv.set_updater([](const Key&, const ArrayView& summed, const ArrayView& stored) {
    for (int64_t i = 0; i < stored.shape.numel(); ++i)
      static_cast<float*>(stored.data)[i] += static_cast<const float*>(summed.data)[i];
  });
}

struct Result {
  int64_t step = 0;
  int64_t sizes_sum = 0;  // sum of num_workers() over the steps
  float key0 = 0, key1 = 0;
  float after_reform = -1;  // key 0 when training resumed after the failure
  int final_size = 0;
};

// A member: keys 0 and 1 (rank 0's init 100 and 0 reach everyone), each step
// pushes 1 per worker to both keys; commit every 2 steps; member `die_id`
// dies at step `die_at`.
void member(int id, ElasticHub& hub, int die_id, int die_at, int steps, std::vector<Result>* out,
            std::atomic<int>* reforms) {
  std::unique_ptr<Communicator> comm = hub.join(id);
  AllreduceStore kv("dist_sync_allreduce", store_options(),
                    [&]() -> Communicator& { return *comm; });
  // The hub ranks the first round in the order the members asked.
  const bool first = comm->rank() == 0;
  kv.init({Key(0), Key(1)}, {Array::full(Shape{kLen}, first ? 100.0 : -1.0).view(),
                             Array::full(Shape{kLen}, first ? 0.0 : -1.0).view()});
  add_updater(kv);
  Result r;
  el::BufferState state([&]() -> Communicator& { return *comm; });
  state.add_value("step", &r.step);
  state.add_value("sizes", &r.sizes_sum);
  elastic_track_store(state, kv);
  bool resumed = false;
  state.register_reset_callbacks({[&] {
    reforms->fetch_add(1);
    resumed = true;
    EXPECT_EQ(kv.num_workers(), comm->size());  // re-bound before the callbacks
  }});
  try {
    el::run(
        state,
        [&] {
          if (resumed) r.after_reform = pull0(kv, 0);  // synced from rank 0
          for (; r.step < steps;) {
            if (id == die_id && r.step == die_at) {
              hub.leave();
              comm->shutdown();  // the in-process transport's death
              throw std::runtime_error("died");
            }
            Array g = Array::full(Shape{kLen}, 1.0);
            Array o0(Shape{kLen}, DType::kFloat32), o1(Shape{kLen}, DType::kFloat32);
            kv.pushpull({Key(0), Key(1)}, {ArrayList{g.view()}, ArrayList{g.view()}},
                        {ArrayList{o0.view()}, ArrayList{o1.view()}});
            r.sizes_sum += kv.num_workers();
            ++r.step;
            if (r.step % 2 == 0) state.commit();
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
  r.key0 = pull0(kv, 0);
  r.key1 = pull0(kv, 1);
  r.final_size = kv.num_workers();
  (*out)[static_cast<size_t>(id)] = r;
  kv.barrier();
}

TEST(AllreduceStoreElastic, AMemberDiesTheStoresReformAndSumOverThree) {
  constexpr int n = 4, steps = 10, die_at = 5;
  ElasticHub hub(n);
  std::vector<Result> out(n);
  std::atomic<int> reforms{0};
  std::vector<std::thread> threads;
  for (int id = 0; id < n; ++id)
    threads.emplace_back(member, id, std::ref(hub), 3, die_at, steps, &out, &reforms);
  for (auto& t : threads)
    t.join();
  EXPECT_GE(hub.round(), 2u);
  EXPECT_GE(reforms.load(), 3);
  // Committed at step 4 with 4 workers: rank 0's committed key 0 is 100 + 16.
  // Step 4 (pushed by some survivors, perhaps applied by some) is undone and
  // redone with 3 workers, as are the steps after it.
  const float committed = 100.f + 4.f * 4;
  for (int id = 0; id < 3; ++id) {
    SCOPED_TRACE(id);
    EXPECT_EQ(out[id].final_size, 3);
    EXPECT_EQ(out[id].step, steps);
    EXPECT_FLOAT_EQ(out[id].after_reform, committed);
    EXPECT_EQ(out[id].sizes_sum, 4 * 4 + 3 * (steps - 4));
    EXPECT_FLOAT_EQ(out[id].key0, committed + 3.f * (steps - 4));
    EXPECT_FLOAT_EQ(out[id].key1, 4.f * 4 + 3.f * (steps - 4));
  }
}

// Members whose values differ (a rank-specific updater) all take rank 0's on
// elastic_sync, and that becomes the copy a restore goes back to.
TEST(AllreduceStoreElastic, SyncMakesEveryMembersValuesRankZeros) {
  constexpr int n = 3;
  ElasticHub hub(n);
  std::vector<std::thread> threads;
  for (int id = 0; id < n; ++id)
    threads.emplace_back([&, id] {
      std::unique_ptr<Communicator> comm = hub.join(id);
      AllreduceStore kv("dist_sync_allreduce", store_options(),
                        [&]() -> Communicator& { return *comm; });
      kv.init(7, Array::full(Shape{kLen}, 0.0).view());
      const int rank = comm->rank();  // the hub ranks members in the order they asked
      kv.set_updater([rank](const Key&, const ArrayView& summed, const ArrayView& stored) {
        for (int64_t i = 0; i < stored.shape.numel(); ++i)
          static_cast<float*>(stored.data)[i] =
              static_cast<const float*>(summed.data)[i] * (rank + 1);
      });
      kv.push(7, Array::full(Shape{kLen}, 1.0).view());
      EXPECT_FLOAT_EQ(pull0(kv, 7), 3.f * (rank + 1));  // diverged
      kv.elastic_sync();
      EXPECT_FLOAT_EQ(pull0(kv, 7), 3.f);
      kv.push(7, Array::full(Shape{kLen}, 2.0).view());
      kv.elastic_abandon();
      kv.elastic_restore();
      EXPECT_FLOAT_EQ(pull0(kv, 7), 3.f);  // the synced copy, not the push after it
      // Abandoned and not re-bound: operations fail at once instead of waiting.
      EXPECT_THROW(kv.push(7, Array::full(Shape{kLen}, 1.0).view()), PeerFailure);
      EXPECT_THROW(kv.barrier(), PeerFailure);
    });
  for (auto& t : threads)
    t.join();
}

// A member dies; while the survivors re-form the launcher refuses (too few
// workers): run() ends with the refusal, the store fails its operations with
// PeerFailure instead of hanging, and it closes cleanly.
TEST(AllreduceStoreElastic, ARefusalWhileReformingEndsCleanly) {
  constexpr int n = 3;
  ElasticHub hub(n);
  std::vector<std::string> ended(n);
  std::vector<std::thread> threads;
  for (int id = 0; id < n; ++id)
    threads.emplace_back([&, id] {
      std::unique_ptr<Communicator> comm = hub.join(id);
      AllreduceStore kv("dist_sync_allreduce", store_options(),
                        [&]() -> Communicator& { return *comm; });
      kv.init(1, Array::full(Shape{kLen}, 0.0).view());
      el::BufferState state([&]() -> Communicator& { return *comm; });
      int64_t step = 0;
      state.add_value("step", &step);
      elastic_track_store(state, kv);
      int resets = 0;
      try {
        el::run(
            state,
            [&] {
              for (; step < 6; ++step) {
                if (id == 2 && step == 2) {
                  hub.leave();
                  comm->shutdown();
                  throw std::runtime_error("died");
                }
                kv.push(1, Array::full(Shape{kLen}, 1.0).view());
                if (step % 2 == 1) state.commit();
              }
            },
            [&] {
              // The first re-formation fails like a member dying during it
              // (retried), the second is the launcher's refusal.
              comm->shutdown();
              if (++resets == 1) throw PeerFailure("a member died while re-forming");
              throw Internal("elastic: 2 workers left, fewer than --min-workers 3");
            });
      } catch (const std::exception& e) {
        ended[static_cast<size_t>(id)] = e.what();
      }
      if (id != 2) {
        EXPECT_EQ(resets, 2);
        EXPECT_THROW(kv.push(1, Array::full(Shape{kLen}, 1.0).view()), PeerFailure);
        Array o(Shape{kLen}, DType::kFloat32);
        kv.pull(1, o.view());  // local reads still work
      }
    });
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(ended[2], "died");
  for (int id = 0; id < 2; ++id)
    EXPECT_NE(ended[static_cast<size_t>(id)].find("--min-workers"), std::string::npos) << id;
}

TEST(AllreduceStoreElastic, OnlyAStoreThatFollowsTheGroupCanBeTracked) {
  transport::InProcessFabric fabric(1);
  auto comm = std::make_unique<Communicator>(fabric.endpoint(0), collective::CommunicatorOptions{});
  Communicator* raw = comm.get();
  AllreduceStore fixed("dist_sync_allreduce", store_options(), std::move(comm));
  el::BufferState state([&]() -> Communicator& { return *raw; });
  EXPECT_THROW(elastic_track_store(state, fixed), InvalidArgument);
  auto local = create_kvstore("local");
  EXPECT_THROW(elastic_track_store(state, *local), InvalidArgument);
}

}  // namespace
}  // namespace pushpull
