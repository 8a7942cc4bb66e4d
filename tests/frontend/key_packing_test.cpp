// SPDX-License-Identifier: Apache-2.0
// pack_keys (include/pushpull/frontend/key_packing.h): the Trainers' keys.
#include "pushpull/frontend/key_packing.h"

#include <gtest/gtest.h>

#include <vector>

#include "pushpull/error.h"

namespace pushpull::frontend {
namespace {

TEST(KeyPacking, LargeParametersAloneSmallOnesPackedInOrderUpToTheBucket) {
  // 4-byte elements: fuse_below 64 bytes = 16 elements; bucket 40 bytes = 10.
  const std::vector<int64_t> numels{4, 100, 3, 4, 16, 2, 1};
  auto units = pack_keys(numels, 10, 64, 40);
  ASSERT_EQ(units.size(), 4u);
  // {0, 2} fill 28 bytes; 3 would make 44 > 40: a new bucket {3, 5, 6}.
  EXPECT_EQ(units[0].key, 10);
  EXPECT_EQ(units[0].members, (std::vector<size_t>{0, 2}));
  EXPECT_EQ(units[0].offsets, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(units[0].numel, 7);
  EXPECT_TRUE(units[0].packed());
  EXPECT_EQ(units[1].key, 11);
  EXPECT_FALSE(units[1].packed());
  EXPECT_EQ(units[2].key, 13);
  EXPECT_EQ(units[2].members, (std::vector<size_t>{3, 5, 6}));
  EXPECT_EQ(units[2].offsets, (std::vector<int64_t>{0, 4, 6}));
  EXPECT_EQ(units[3].key, 14);  // 16 elements = 64 bytes: alone
  EXPECT_EQ(units[3].numel, 16);
}

TEST(KeyPacking, FuseBelowZeroGivesAKeyPerParameterAndBadSettingsAreRefused) {
  const std::vector<int64_t> numels{1, 2, 3};
  auto units = pack_keys(numels, 0, 0, 1 << 20);
  ASSERT_EQ(units.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(units[i].key, static_cast<int64_t>(i));
  EXPECT_THROW(pack_keys(numels, 0, -1, 1), InvalidArgument);
  EXPECT_THROW(pack_keys(numels, 0, 0, 0), InvalidArgument);
  const std::vector<int64_t> bad{-1};
  EXPECT_THROW(pack_keys(bad, 0, 0, 1), InvalidArgument);
}

}  // namespace
}  // namespace pushpull::frontend
