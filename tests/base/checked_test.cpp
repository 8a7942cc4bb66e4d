// SPDX-License-Identifier: Apache-2.0
// Overflow-checked size math (pushpull/checked.h) and the shapes built on it.
#include "pushpull/checked.h"

#include <gtest/gtest.h>

#include <limits>

#include "pushpull/array.h"
#include "pushpull/error.h"

namespace pushpull {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(Checked, MulAndAddReportOverflow) {
  int64_t out = 0;
  EXPECT_TRUE(checked_mul<int64_t>(1 << 20, 1 << 20, &out));
  EXPECT_EQ(out, int64_t{1} << 40);
  EXPECT_FALSE(checked_mul<int64_t>(int64_t{1} << 62, 4, &out));
  EXPECT_FALSE(checked_add<int64_t>(kMax, 1, &out));
  size_t bytes = 0;
  EXPECT_FALSE(checked_bytes(int64_t{1} << 62, 4, &bytes));  // 2^64: wraps to 0 unchecked
  EXPECT_FALSE(checked_bytes(-1, 4, &bytes));
  EXPECT_TRUE(checked_bytes(3, 8, &bytes));
  EXPECT_EQ(bytes, 24u);
}

TEST(Checked, RangeInsideNeverOverflows) {
  EXPECT_TRUE(range_inside(int64_t{0}, int64_t{10}, int64_t{10}));
  EXPECT_TRUE(range_inside(int64_t{10}, int64_t{0}, int64_t{10}));
  EXPECT_FALSE(range_inside(int64_t{1}, kMax, int64_t{10}));  // begin + count wraps negative
  EXPECT_FALSE(range_inside(int64_t{-1}, int64_t{2}, int64_t{10}));
  EXPECT_FALSE(range_inside(int64_t{5}, int64_t{-1}, int64_t{10}));
  EXPECT_FALSE(range_inside(int64_t{11}, int64_t{0}, int64_t{10}));
  EXPECT_FALSE(range_inside(uint64_t{8}, ~uint64_t{0}, uint64_t{16}));
  EXPECT_TRUE(range_inside(uint64_t{8}, uint64_t{8}, uint64_t{16}));
}

TEST(Shape, RejectsNegativeAndOverflowingDims) {
  EXPECT_THROW(Shape({2, -3}), InvalidArgument);
  EXPECT_THROW(Shape({int64_t{1} << 32, int64_t{1} << 32}), InvalidArgument);
  EXPECT_THROW(Shape({kMax, 2}), InvalidArgument);
  EXPECT_EQ(Shape({int64_t{1} << 31, int64_t{1} << 31}).numel(), int64_t{1} << 62);
  EXPECT_EQ(Shape({}).numel(), 1);
  int64_t n = 0;
  const int64_t big[] = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_FALSE(Shape::checked_numel(big, &n));
}

TEST(Shape, NumelThrowsWhenDimsAreWrittenPastTheLimit) {
  Shape s{4, 4};
  s[0] = kMax;  // operator[] bypasses the constructor's check
  EXPECT_THROW(s.numel(), InvalidArgument);
  s[0] = -1;
  EXPECT_THROW(s.numel(), InvalidArgument);
}

TEST(ArrayView, NbytesThrowsOnOverflow) {
  ArrayView v(nullptr, DType::kFloat64, Shape{int64_t{1} << 61});  // 2^64 bytes
  EXPECT_THROW(v.nbytes(), InvalidArgument);
  ArrayView ok(nullptr, DType::kFloat32, Shape{3, 5});
  EXPECT_EQ(ok.nbytes(), 60u);
}

}  // namespace
}  // namespace pushpull
