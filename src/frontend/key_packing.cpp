// SPDX-License-Identifier: Apache-2.0
#include "pushpull/frontend/key_packing.h"

#include <fmt/format.h>

#include <algorithm>

#include "pushpull/error.h"

namespace pushpull::frontend {

std::vector<KeyUnit> pack_keys(std::span<const int64_t> numels, int64_t key_base,
                               int64_t fuse_below, int64_t bucket_bytes, const char* who) {
  if (fuse_below < 0 || bucket_bytes <= 0) {
    throw InvalidArgument(
        fmt::format("{}: fuse_below must be >= 0 and bucket_bytes > 0, got {} and {}", who,
                    fuse_below, bucket_bytes));
  }
  std::vector<std::vector<size_t>> groups;
  std::vector<size_t> bucket;
  int64_t size = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] < 0)
      throw InvalidArgument(fmt::format("{}: parameter {} has a negative size", who, i));
    const int64_t nbytes = numels[i] * static_cast<int64_t>(sizeof(float));
    if (nbytes >= fuse_below) {
      groups.push_back({i});
      continue;
    }
    if (!bucket.empty() && size + nbytes > bucket_bytes) {
      groups.push_back(std::move(bucket));
      bucket.clear();
      size = 0;
    }
    bucket.push_back(i);
    size += nbytes;
  }
  if (!bucket.empty()) groups.push_back(std::move(bucket));
  // Units by their first member: the keys ascend.
  std::sort(groups.begin(), groups.end());
  std::vector<KeyUnit> units;
  for (auto& members : groups) {
    KeyUnit u;
    u.key = key_base + static_cast<int64_t>(members[0]);
    for (size_t i : members) {
      u.offsets.push_back(u.numel);
      u.numel += numels[i];
    }
    u.members = std::move(members);
    units.push_back(std::move(u));
  }
  return units;
}

}  // namespace pushpull::frontend
