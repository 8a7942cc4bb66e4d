// SPDX-License-Identifier: Apache-2.0
#include "ps/server_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <map>
#include <mutex>

#include "compress/compressor.h"

namespace pushpull::ps {
namespace {

struct Reply {
  Status status;
  DType dtype;
  std::vector<std::byte> data;
};

class Recorder : public ServerResponder {
 public:
  void reply(const RequestMeta& to, const Status& s, DType dtype, std::span<const std::byte> data,
             std::shared_ptr<void>) override {
    std::lock_guard lock(mu_);
    replies_[to.request_id] = Reply{s, dtype, {data.begin(), data.end()}};
  }
  bool has(uint64_t id) {
    std::lock_guard lock(mu_);
    return replies_.count(id) > 0;
  }
  Reply get(uint64_t id) {
    std::lock_guard lock(mu_);
    auto it = replies_.find(id);
    if (it == replies_.end()) ADD_FAILURE() << "no reply to request " << id;
    return it == replies_.end() ? Reply{} : it->second;
  }
  std::vector<float> floats(uint64_t id) {
    Reply r = get(id);
    EXPECT_TRUE(r.status.is_ok()) << r.status.to_string();
    std::vector<float> out(r.data.size() / 4);
    std::memcpy(out.data(), r.data.data(), r.data.size());
    return out;
  }

 private:
  std::mutex mu_;
  std::map<uint64_t, Reply> replies_;
};

Payload payload_of(Array a) {
  auto owner = std::make_shared<Array>(std::move(a));
  return Payload{owner->view(), owner};
}

class ServerStoreTest : public ::testing::Test {
 protected:
  void make(int workers, bool sync, int threads = 2) {
    store_ = std::make_unique<ServerStore>(ServerStoreConfig{workers, sync, threads, 0}, rec_);
  }
  uint64_t next() { return ++id_; }
  uint64_t init(uint64_t key, Array value, int worker = 0) {
    uint64_t id = next();
    store_->init({worker, id}, PartId{key, 0}, fmt::format("k{}", key),
                 payload_of(std::move(value)));
    return id;
  }
  uint64_t push(int worker, uint64_t key, Array grad, bool compressed = false) {
    uint64_t id = next();
    store_->push({worker, id}, PartId{key, 0}, payload_of(std::move(grad)), compressed);
    return id;
  }
  // A pushpull's push (kFlagPullBack): answered with the value once applied.
  uint64_t push_pull(int worker, uint64_t key, Array grad, uint32_t seq = 0) {
    uint64_t id = next();
    RequestMeta m{worker, id};
    m.pull_back = true;
    store_->push(m, PartId{key, 0}, payload_of(std::move(grad)), false, seq);
    return id;
  }
  uint64_t pull(int worker, uint64_t key, std::vector<Range> ranges = {}) {
    uint64_t id = next();
    store_->pull({worker, id}, PartId{key, 0}, std::move(ranges));
    return id;
  }
  void idle() { store_->wait_idle(Millis(10000)); }

  Recorder rec_;
  std::unique_ptr<ServerStore> store_;
  uint64_t id_ = 0;
};

TEST_F(ServerStoreTest, SyncRoundsWithTestOptimizer) {
  const int n = 3;
  make(n, true);
  init(1, Array::full(Shape{2, 3}, 1.0));
  uint64_t opt = next();
  store_->set_optimizer({0, opt}, OptimizerSpec::parse("test:rescale_grad=2"));
  idle();
  ASSERT_TRUE(rec_.get(opt).status.is_ok());
  for (int round = 1; round <= 3; ++round) {
    std::vector<uint64_t> pushes;
    for (int w = 0; w < n; ++w)
      pushes.push_back(push(w, 1, Array::full(Shape{2, 3}, w + 1.0)));
    uint64_t p = pull(1, 1);
    idle();
    for (auto id : pushes)
      EXPECT_TRUE(rec_.get(id).status.is_ok());
    // (N+1)*N/2 * rescale_grad * round + 1
    for (float v : rec_.floats(p))
      EXPECT_EQ(v, 12.0f * round + 1) << "round " << round;
  }
}

TEST_F(ServerStoreTest, PullWaitsForItsWorkersRound) {
  make(2, true);
  init(5, Array::full(Shape{4}, 0.0));
  uint64_t early = pull(0, 5);  // no push yet: answered at once with init value
  uint64_t p0 = push(0, 5, Array::full(Shape{4}, 1.0));
  uint64_t pull0 = pull(0, 5);
  uint64_t pull1 = pull(1, 5);  // worker 1 has not pushed: answered with the old value
  idle();
  EXPECT_EQ(rec_.floats(early)[0], 0.0f);
  EXPECT_EQ(rec_.floats(pull1)[0], 0.0f);
  EXPECT_FALSE(rec_.has(pull0));
  EXPECT_FALSE(rec_.has(p0));
  push(1, 5, Array::full(Shape{4}, 2.0));
  idle();
  EXPECT_TRUE(rec_.get(p0).status.is_ok());
  EXPECT_EQ(rec_.floats(pull0)[3], 3.0f);  // no optimizer: the sum replaces the value
}

TEST_F(ServerStoreTest, AWorkerAheadByARoundIsHeldForTheNext) {
  make(2, true, 1);
  init(2, Array::full(Shape{1}, 0.0));
  push(0, 2, Array::full(Shape{1}, 1.0));
  push(0, 2, Array::full(Shape{1}, 10.0));  // round 2 from worker 0
  uint64_t pull0 = pull(0, 2);              // must see round 2
  push(1, 2, Array::full(Shape{1}, 2.0));   // completes round 1 (1 + 2)
  idle();
  EXPECT_FALSE(rec_.has(pull0));
  uint64_t mid = pull(1, 2);
  idle();
  EXPECT_EQ(rec_.floats(mid)[0], 3.0f);
  push(1, 2, Array::full(Shape{1}, 20.0));  // completes round 2 (10 + 20)
  idle();
  EXPECT_EQ(rec_.floats(pull0)[0], 30.0f);
}

TEST_F(ServerStoreTest, HalfPrecisionIsSummedInFloat32) {
  make(3, true);
  init(3, Array::full(Shape{2}, 0.0, DType::kFloat16));
  // 2048 + 1 + 1 in fp16 steps would stay 2048; in float32 it is 2050.
  push(0, 3, Array::full(Shape{2}, 2048.0, DType::kFloat16));
  push(1, 3, Array::full(Shape{2}, 1.0, DType::kFloat16));
  push(2, 3, Array::full(Shape{2}, 1.0, DType::kFloat16));
  uint64_t p = pull(0, 3);
  idle();
  Reply r = rec_.get(p);
  ASSERT_EQ(r.dtype, DType::kFloat16);
  uint16_t h;
  std::memcpy(&h, r.data.data(), 2);
  EXPECT_EQ(half_to_float(h), 2050.0f);
}

TEST_F(ServerStoreTest, AsyncNeedsAnOptimizerAndAppliesEachPush) {
  make(2, false);
  init(4, Array::full(Shape{3}, 0.0));
  uint64_t bad = push(0, 4, Array::full(Shape{3}, 1.0));
  idle();
  EXPECT_EQ(rec_.get(bad).status.code(), ErrorCode::kInvalidArgument);
  store_->set_optimizer({0, next()}, OptimizerSpec::parse("test:rescale_grad=1"));
  for (int i = 0; i < 5; ++i)
    push(i % 2, 4, Array::full(Shape{3}, 1.0));
  uint64_t p = pull(1, 4);
  idle();
  EXPECT_EQ(rec_.floats(p)[2], 5.0f);
}

TEST_F(ServerStoreTest, CompressedPushesAreDecodedAndSummed) {
  make(2, true);
  init(6, Array::full(Shape{20}, 0.0));
  for (int w = 0; w < 2; ++w) {
    compress::Compressor codec(compress::Settings{compress::Type::k2Bit, 0.5f});
    std::vector<float> g(20, w == 0 ? 0.6f : -0.2f);
    Array wire(Shape{static_cast<int64_t>(codec.encoded_bytes(20))}, DType::kUInt8);
    codec.encode(6, 0, 20, 0, g.data(), 20, static_cast<std::byte*>(wire.data()));
    push(w, 6, std::move(wire), true);
  }
  uint64_t p = pull(0, 6);
  idle();
  // No optimizer: the pull gets the round's value encoded by the server
  // (docs/kvstore.md "Compressed pulls"); 0.5 is exactly +t again.
  const Reply r = rec_.get(p);
  ASSERT_TRUE(r.status.is_ok()) << r.status.to_string();
  ASSERT_EQ(r.data.size(), compress::kHeaderBytes + 8) << "20 values: two 2-bit words";
  std::vector<float> got(20, 0.0f);
  ASSERT_TRUE(compress::decode_add(r.data, got.data(), 20).is_ok());
  for (float v : got)
    EXPECT_EQ(v, 0.5f);  // +t from worker 0, 0 from worker 1
}

// A malformed compressed push is refused (error reply) and changes nothing.
TEST_F(ServerStoreTest, MalformedCompressedPushIsRefused) {
  make(1, true);
  init(9, Array::full(Shape{20}, 2.0));
  Array junk = Array::full(Shape{11}, 3.0, DType::kUInt8);  // no valid header
  uint64_t bad = push(0, 9, std::move(junk), true);
  uint64_t p = pull(0, 9);
  idle();
  EXPECT_EQ(rec_.get(bad).status.code(), ErrorCode::kProtocolError);
  for (float v : rec_.floats(p))
    EXPECT_EQ(v, 2.0f);
}

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
