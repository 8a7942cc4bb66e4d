// SPDX-License-Identifier: Apache-2.0
// Fuzz target: IDX files (data/idx_decode.h, behind read_idx) as a program
// reading a dataset gets them. Bad bytes must throw pushpull::Error; a file
// that decodes holds exactly the product of its dimensions in bytes (checked
// without overflow here too), its values are the bytes after the header, and
// the item size is bounded by what the file holds unless it has no items.
#include <cstring>

#include "data/idx_decode.h"
#include "fuzz_input.h"
#include "pushpull/checked.h"
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
  size_t total = 1;
  for (uint32_t d : a.dims)
    pushpull::fuzz::require(checked_mul<size_t>(total, d, &total));
  pushpull::fuzz::require(a.values.size() == total);
  const size_t header = 4 + 4 * a.dims.size();
  pushpull::fuzz::require(bytes.size() >= header + total);
  pushpull::fuzz::require(total == 0 ||
                          std::memcmp(a.values.data(), bytes.data() + header, total) == 0);
  pushpull::fuzz::require(a.count() == 0 || a.item_size() * a.count() == total);
  return 0;
}
