// SPDX-License-Identifier: Apache-2.0
// ServerStore (ps/server_store.h) without a network: sync and async rounds,
// pulls waiting for their round, a worker a round ahead, half precision
// summed in float32, compressed pushes (and malformed ones).
#include <gtest/gtest.h>

#include <cstring>

#include "compress/compressor.h"
#include "server_store_fixture.h"

namespace pushpull::ps {
namespace {

using namespace store_testing;

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

}  // namespace
}  // namespace pushpull::ps
