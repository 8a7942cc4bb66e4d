// SPDX-License-Identifier: Apache-2.0
// The Trainers' store keys, written once for both torch front ends (the
// libtorch pushpull::torch::Trainer and pushpull.torch.Trainer): parameter i
// of at least `fuse_below` bytes is key key_base + i alone; smaller ones are
// packed in order into flat keys of at most `bucket_bytes`, each under the
// key of its first parameter, as DDP packs gradients into buckets. Every
// pushpull optimizer is elementwise, so a packed key updates exactly as its
// parameters would one by one. fuse_below = 0: no packing.
//
// Pure functions over parameter sizes (float32 elements); thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace pushpull::frontend {

struct KeyUnit {
  int64_t key = 0;
  std::vector<size_t> members;   // parameter indices, ascending
  std::vector<int64_t> offsets;  // each member's first element in the flat buffer
  int64_t numel = 0;             // elements of every member together
  bool packed() const { return members.size() > 1; }
};

// The keys of parameters of `numels` elements (float32), ordered by first
// member. InvalidArgument for fuse_below < 0 or bucket_bytes <= 0 (naming
// `who`) or a negative size.
std::vector<KeyUnit> pack_keys(std::span<const int64_t> numels, int64_t key_base,
                               int64_t fuse_below, int64_t bucket_bytes,
                               const char* who = "Trainer");

}  // namespace pushpull::frontend
