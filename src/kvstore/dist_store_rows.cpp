// SPDX-License-Identifier: Apache-2.0
// The DistStore's row_sparse_pull: the rows asked for, per slice, as element
// ranges; the other rows of the outputs are zero. (Moved out of
// dist_store_data.cpp unchanged.)
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "kvstore/dist_store.h"
#include "kvstore/validate.h"
#include "ps/protocol.h"

namespace pushpull {

KVHandle DistStore::row_sparse_pull_async(const Key& key, const ArrayList& outs,
                                          const ArrayView& row_ids, int priority) {
  KeyInfo* k = infos("row_sparse_pull", {key}, 1).front();
  if (k->shape.ndim() < 1)
    throw InvalidArgument(fmt::format("row_sparse_pull of key {}: the value {} has no rows",
                                      key.to_string(), k->shape.to_string()));
  kv::check_list("row_sparse_pull", type_, key, k->shape, k->dtype, outs, "output");
  const int64_t rows = k->shape[0];
  const int64_t row_len = rows ? k->shape.numel() / rows : 0;
  std::vector<int64_t> ids = kv::check_row_ids(key, row_ids, rows);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const size_t esize = dtype_size(k->dtype);
  for (const auto& o : outs)
    std::memset(o.data, 0, o.nbytes());  // rows not asked for are zero

  struct Ask {
    ps::Slice slice;
    std::vector<ps::Range> ranges;
  };
  std::vector<Ask> asks;
  for (const auto& s : k->slices) {
    Ask a{s, {}};
    for (int64_t r : ids) {
      int64_t lo = std::max(r * row_len, s.begin),
              hi = std::min((r + 1) * row_len, s.begin + s.count);
      if (hi > lo) a.ranges.push_back({lo - s.begin, hi - lo});
    }
    if (!a.ranges.empty()) asks.push_back(std::move(a));
  }
  auto done = std::make_shared<Completion>(static_cast<int>(asks.size()));
  for (auto& a : asks) {
    auto payload = std::make_shared<std::vector<std::byte>>(ps::encode_ranges(a.ranges));
    transport::Header h{.type = ps::msg::kPull,
                        .key = k->id,
                        .dtype = static_cast<uint32_t>(k->dtype),
                        .offset = static_cast<uint64_t>(a.slice.begin),
                        .length = static_cast<uint64_t>(a.slice.count)};
    request(a.slice.server, h, payload->data(), payload->size(), payload, done, priority,
            [outs, a, esize](const std::byte* d, size_t n) {
              size_t want = 0;
              for (const auto& r : a.ranges)
                want += static_cast<size_t>(r.count) * esize;
              if (n != want)
                throw ProtocolError(
                    fmt::format("row_sparse_pull reply has {} bytes, expected {}", n, want));
              for (const auto& r : a.ranges) {
                size_t at = static_cast<size_t>(a.slice.begin + r.begin) * esize;
                size_t len = static_cast<size_t>(r.count) * esize;
                for (const auto& o : outs)
                  std::memcpy(static_cast<std::byte*>(o.data) + at, d, len);
                d += len;
              }
            });
  }
  return KVHandle(done);
}

}  // namespace pushpull
