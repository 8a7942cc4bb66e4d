// SPDX-License-Identifier: Apache-2.0
// Fuzz target: IDX files (data/idx_decode.h, behind read_idx) as a program
// reading a dataset gets them. Bad bytes must throw pushpull::Error; a file
// that decodes holds exactly the product of its dimensions in bytes (checked
// exactly, in 128 bits), its values are the bytes after the header, and
// the item size is bounded by what the file holds unless it has no items.
#include <cstring>

#include "data/idx_decode.h"
#include "fuzz_input.h"
#include "pushpull/error.h"

using namespace pushpull;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  (void)sel;
  std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  data::IdxArray a;
  try {
    a = data::decode_idx(bytes, "<fuzz>");
  } catch (const pushpull::Error&) {
    return 0;
  }
  pushpull::fuzz::require(!a.dims.empty() && a.dims.size() <= 4);
  // Four 32-bit dimensions multiply to below 2^128: exact in 128 bits, in
  // any order (a 64-bit product could overflow before a later zero).
  unsigned __int128 exact = 1;
  for (uint32_t d : a.dims)
    exact *= d;
  pushpull::fuzz::require(exact == a.values.size());
  const size_t total = a.values.size();
  const size_t header = 4 + 4 * a.dims.size();
  pushpull::fuzz::require(bytes.size() >= header + total);
  pushpull::fuzz::require(total == 0 ||
                          std::memcmp(a.values.data(), bytes.data() + header, total) == 0);
  pushpull::fuzz::require(a.count() == 0 || a.item_size() * a.count() == total);
  return 0;
}
