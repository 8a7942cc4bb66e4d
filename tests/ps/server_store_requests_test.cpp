// SPDX-License-Identifier: Apache-2.0
// ServerStore (ps/server_store.h) without a network: range pulls, bad and
// oversized requests, the per-worker bounds on held pushes and waiting pulls,
// a pulled value in flight, pushes with pull-back, optimizer states.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "server_store_fixture.h"

namespace pushpull::ps {
namespace {

using namespace store_testing;

TEST_F(ServerStoreTest, RangePullsGatherRows) {
  make(1, true);
  Array v(Shape{4, 2}, DType::kFloat32);
  for (int i = 0; i < 8; ++i)
    v.as<float>()[i] = static_cast<float>(i);
  init(7, std::move(v));
  uint64_t p = pull(0, 7, {{6, 2}, {0, 2}, {6, 2}});
  uint64_t bad = pull(0, 7, {{7, 2}});
  idle();
  EXPECT_EQ(rec_.floats(p), (std::vector<float>{6, 7, 0, 1, 6, 7}));
  EXPECT_EQ(rec_.get(bad).status.code(), ErrorCode::kInvalidArgument);
}

TEST_F(ServerStoreTest, BadRequestsGetErrorsAndChangeNothing) {
  make(2, true);
  init(8, Array::full(Shape{2, 3}, 1.0));
  uint64_t again = init(8, Array::full(Shape{2, 3}, 5.0));
  uint64_t unknown = push(0, 99, Array::full(Shape{1}, 1.0));
  uint64_t shape = push(0, 8, Array::full(Shape{3, 3}, 1.0));
  uint64_t dtype = push(0, 8, Array::full(Shape{2, 3}, 1.0, DType::kFloat64));
  uint64_t nopull = pull(0, 98);
  uint64_t p = pull(0, 8);
  idle();
  EXPECT_EQ(rec_.get(again).status.code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(rec_.get(unknown).status.code(), ErrorCode::kNotFound);
  EXPECT_EQ(rec_.get(shape).status.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(rec_.get(shape).status.message().find("(3, 3)"), std::string::npos);
  EXPECT_EQ(rec_.get(dtype).status.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(rec_.get(nopull).status.code(), ErrorCode::kNotFound);
  for (float v : rec_.floats(p))
    EXPECT_EQ(v, 1.0f);  // the bad push did not open a round
}

TEST_F(ServerStoreTest, OverflowingOrOversizedPullRangesAreRefused) {
  make(1, true);
  init(9, Array::full(Shape{4, 2}, 1.0));
  const int64_t max = std::numeric_limits<int64_t>::max();
  // begin + count overflows int64 (it used to wrap negative and pass the check).
  uint64_t wrap = pull(0, 9, {{1, max}});
  uint64_t far = pull(0, 9, {{max, 1}});
  uint64_t negative = pull(0, 9, {{-1, 2}});
  // Inside the value each, but together more than the value: unbounded replies.
  std::vector<Range> many(5, Range{0, 8});
  uint64_t too_much = pull(0, 9, many);
  uint64_t fine = pull(0, 9, {{2, 4}});
  idle();
  for (uint64_t id : {wrap, far, negative, too_much})
    EXPECT_EQ(rec_.get(id).status.code(), ErrorCode::kInvalidArgument) << id;
  EXPECT_EQ(rec_.floats(fine).size(), 4u);
}

TEST_F(ServerStoreTest, HeldPushesAndWaitingPullsAreBoundedPerWorker) {
  ServerStoreConfig config{2, true, 1, 0};
  config.max_queued_per_worker = 3;
  store_ = std::make_unique<ServerStore>(config, rec_);
  init(10, Array::full(Shape{2}, 0.0));
  std::vector<uint64_t> pushes, pulls;
  for (int i = 0; i < 5; ++i)  // 1 in the open round, 3 held, 1 over the cap
    pushes.push_back(push(0, 10, Array::full(Shape{2}, 1.0)));
  for (int i = 0; i < 4; ++i)  // 3 wait for worker 0's pushes, 1 over the cap
    pulls.push_back(pull(0, 10));
  idle();
  EXPECT_EQ(rec_.get(pushes[4]).status.code(), ErrorCode::kProtocolError);
  EXPECT_EQ(rec_.get(pulls[3]).status.code(), ErrorCode::kProtocolError);
  EXPECT_FALSE(rec_.has(pulls[0]));
  for (int i = 0; i < 4; ++i)
    push(1, 10, Array::full(Shape{2}, 2.0));
  idle();
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(rec_.get(pushes[static_cast<size_t>(i)]).status.is_ok());
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(rec_.floats(pulls[static_cast<size_t>(i)])[0], 3.0f);  // round 4: 1 + 2
  // The refused push was not counted: worker 0 can go on.
  uint64_t again = push(0, 10, Array::full(Shape{2}, 1.0));
  push(1, 10, Array::full(Shape{2}, 1.0));
  idle();
  EXPECT_TRUE(rec_.get(again).status.is_ok());
}

TEST_F(ServerStoreTest, APulledValueInFlightIsNotChangedByTheNextRound) {
  // The reply's owner keeps the bytes alive; the next update must copy.
  class Keeper : public ServerResponder {
   public:
    void reply(const RequestMeta& to, const Status&, DType, std::span<const std::byte> data,
               std::shared_ptr<void> owner) override {
      std::lock_guard lock(mu);
      if (to.request_id == 2) {
        kept = owner;
        bytes = data;
      }
    }
    std::mutex mu;
    std::shared_ptr<void> kept;
    std::span<const std::byte> bytes;
  } keeper;
  ServerStore store(ServerStoreConfig{1, true, 1, 0}, keeper);
  auto v = std::make_shared<Array>(Array::full(Shape{1000}, 1.0));
  store.init({0, 1}, PartId{1, 0}, "k", Payload{v->view(), v});
  store.pull({0, 2}, PartId{1, 0}, {});
  store.wait_idle(Millis(10000));
  ASSERT_TRUE(keeper.kept);
  for (int i = 0; i < 2; ++i) {
    auto g = std::make_shared<Array>(Array::full(Shape{1000}, 5.0));
    store.push({0, 3u + i}, PartId{1, 0}, Payload{g->view(), g}, false);
  }
  store.set_optimizer({0, 9}, OptimizerSpec::parse("test:rescale_grad=1"));
  auto g = std::make_shared<Array>(Array::full(Shape{1000}, 5.0));
  store.push({0, 10}, PartId{1, 0}, Payload{g->view(), g}, false);
  store.wait_idle(Millis(10000));
  float first;
  std::memcpy(&first, keeper.bytes.data(), 4);
  EXPECT_EQ(first, 1.0f);  // what was being sent is still the init value
}

TEST_F(ServerStoreTest, APushWithPullBackIsAnsweredWithItsRoundsValue) {
  make(2, true, 1);
  init(4, Array::full(Shape{3}, 0.0));
  uint64_t first = push_pull(0, 4, Array::full(Shape{3}, 1.0));
  uint64_t between = pull(0, 4);                                   // after round 1
  uint64_t second = push_pull(0, 4, Array::full(Shape{3}, 10.0));  // held for round 2
  idle();
  EXPECT_FALSE(rec_.has(first));  // no acknowledgement before its round
  uint64_t plain = push(1, 4, Array::full(Shape{3}, 2.0));
  idle();
  EXPECT_TRUE(rec_.get(plain).status.is_ok());
  EXPECT_TRUE(rec_.get(plain).data.empty());  // a plain push still gets an empty acknowledgement
  EXPECT_EQ(rec_.floats(first), std::vector<float>(3, 3.0f));  // round 1's value, not an ack
  EXPECT_EQ(rec_.floats(between), std::vector<float>(3, 3.0f));
  EXPECT_FALSE(rec_.has(second));
  push_pull(1, 4, Array::full(Shape{3}, 20.0));
  idle();
  EXPECT_EQ(rec_.floats(second), std::vector<float>(3, 30.0f));
}

TEST_F(ServerStoreTest, AResentPushWithPullBackIsAnsweredWithTheValueNotAppliedTwice) {
  // A worker re-sends the pushpull of an unfinished round after a fail-over;
  // the new primary had applied it already.
  make(1, true, 1);
  init(6, Array::full(Shape{2}, 0.0));
  uint64_t once = push_pull(0, 6, Array::full(Shape{2}, 4.0), 1);
  idle();
  EXPECT_EQ(rec_.floats(once), std::vector<float>(2, 4.0f));
  uint64_t again = push_pull(0, 6, Array::full(Shape{2}, 4.0), 1);
  idle();
  EXPECT_EQ(rec_.floats(again), std::vector<float>(2, 4.0f));
}

TEST_F(ServerStoreTest, AFailedPushWithPullBackIsAnsweredWithItsErrorOnly) {
  make(1, true, 1);
  init(7, Array::full(Shape{2}, 0.0));
  uint64_t wrong_size = push_pull(0, 7, Array::full(Shape{3}, 1.0));
  uint64_t unknown = push_pull(0, 99, Array::full(Shape{2}, 1.0));
  idle();
  EXPECT_EQ(rec_.get(wrong_size).status.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(rec_.get(unknown).status.code(), ErrorCode::kNotFound);
  // Nothing was counted: the next pushpull is round 1.
  uint64_t good = push_pull(0, 7, Array::full(Shape{2}, 5.0));
  idle();
  EXPECT_EQ(rec_.floats(good), std::vector<float>(2, 5.0f));
}

TEST_F(ServerStoreTest, OptimizerStatesSaveAndLoad) {
  make(1, true);
  init(9, Array::full(Shape{3}, 1.0));
  store_->set_optimizer({0, next()}, OptimizerSpec::parse("sgd:learning_rate=0.1,momentum=0.9"));
  push(0, 9, Array::full(Shape{3}, 1.0));
  uint64_t save = next();
  store_->save_states({0, save});
  idle();
  Reply saved = rec_.get(save);
  ASSERT_TRUE(saved.status.is_ok()) << saved.status.to_string();
  ASSERT_FALSE(saved.data.empty());
  push(0, 9, Array::full(Shape{3}, 1.0));  // changes the momentum
  uint64_t load = next();
  store_->load_states(
      {0, load}, std::string(reinterpret_cast<const char*>(saved.data.data()), saved.data.size()));
  uint64_t again = next();
  store_->save_states({0, again});
  idle();
  EXPECT_TRUE(rec_.get(load).status.is_ok()) << rec_.get(load).status.to_string();
  EXPECT_EQ(rec_.get(again).data, saved.data);
}

}  // namespace
}  // namespace pushpull::ps
