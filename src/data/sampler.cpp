// SPDX-License-Identifier: Apache-2.0
#include "pushpull/data/sampler.h"

#include <random>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::data {

SplitSampler::SplitSampler(size_t length, size_t num_parts, size_t part_index, uint64_t seed,
                           Remainder remainder, bool shuffle)
    : length_(length),
      num_parts_(num_parts),
      part_index_(part_index),
      seed_(seed),
      shuffle_(shuffle) {
  if (num_parts == 0 || part_index >= num_parts)
    throw InvalidArgument(fmt::format("part_index {} is not in 0..num_parts-1 (num_parts {})",
                                      part_index, num_parts));
  part_len_ =
      remainder == Remainder::kDrop ? length / num_parts : (length + num_parts - 1) / num_parts;
  if (part_len_ == 0)
    throw InvalidArgument(fmt::format(
        "a dataset of {} items cannot be split into {} non-empty parts", length, num_parts));
}

std::vector<size_t> SplitSampler::indices(uint64_t epoch) const {
  std::vector<size_t> idx(part_len_);
  size_t start = part_len_ * part_index_;
  for (size_t i = 0; i < part_len_; ++i)
    idx[i] = (start + i) % length_;  // wrap = pad
  if (!shuffle_) return idx;
  // One stream per (seed, epoch, part): seed_seq mixes them well.
  std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32),
                    static_cast<uint32_t>(epoch), static_cast<uint32_t>(epoch >> 32),
                    static_cast<uint32_t>(part_index_)};
  std::mt19937_64 rng(seq);
  for (size_t i = part_len_; i > 1; --i) {
    size_t j = static_cast<size_t>(rng() % i);  // bias < 2^-40 for datasets < 2^24
    std::swap(idx[i - 1], idx[j]);
  }
  return idx;
}

}  // namespace pushpull::data
