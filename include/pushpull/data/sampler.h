// SPDX-License-Identifier: Apache-2.0
// Partitioning sampler with the meaning of MXNet's SplitSampler: the dataset
// of `length` items is cut into `num_parts` contiguous parts of equal length,
// part `part_index` belongs to this worker, and its indices are shuffled per
// epoch from a seed.
//
// Equal lengths matter: in a synchronous job every worker must run the same
// number of batches, or the last sync round waits for a worker that has none.
// The remainder (length % num_parts items) is either dropped (default) or the
// parts are padded to ceil(length / num_parts) with items from the start of
// the dataset.
//
// Deterministic: the same (length, num_parts, part_index, seed, epoch) always
// gives the same order, on any machine (std::mt19937_64 and a Fisher-Yates
// shuffle written here, not std::shuffle, whose algorithm is unspecified).
//
// Thread safety: const methods are safe to call concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pushpull::data {

enum class Remainder { kDrop, kPad };

class SplitSampler {
 public:
  // Throws InvalidArgument unless 0 <= part_index < num_parts and the part is
  // not empty.
  SplitSampler(size_t length, size_t num_parts, size_t part_index, uint64_t seed = 0,
               Remainder remainder = Remainder::kDrop, bool shuffle = true);

  // Items in this part (the same for every part).
  size_t size() const { return part_len_; }
  // Dataset indices of this part in the order of `epoch`.
  std::vector<size_t> indices(uint64_t epoch) const;
  // Batches per epoch for `batch_size` (the last partial batch counts).
  size_t num_batches(size_t batch_size) const { return (part_len_ + batch_size - 1) / batch_size; }

 private:
  size_t length_;
  size_t num_parts_;
  size_t part_index_;
  uint64_t seed_;
  bool shuffle_;
  size_t part_len_;
};

}  // namespace pushpull::data
