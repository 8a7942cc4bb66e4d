// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the shared-memory setup messages (transport/shm/shm_setup.h): offer,
// answer, confirmation, and a lent block's reference (transport/shm/lend.h). One that
// decodes re-encodes to the same bytes, a name it accepts is one pushpull
// makes (never a path), and a lent range lies inside its block.
#include <algorithm>

#include "fuzz_input.h"
#include "transport/shm/lend.h"
#include "transport/shm/shm_setup.h"

using namespace pushpull::transport;

namespace {
bool same(const std::vector<std::byte>& a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  switch (sel % 4) {
    case 0: {
      ShmOffer m;
      if (decode(in, &m).is_ok()) {
        pushpull::fuzz::require(ShmSegment::valid_name(m.name));
        pushpull::fuzz::require(same(encode(m), in));
      }
      break;
    }
    case 1: {
      ShmAnswer m;
      if (decode(in, &m).is_ok()) {
        pushpull::fuzz::require(!m.accepted || ShmSegment::valid_name(m.name));
        pushpull::fuzz::require(same(encode(m), in));
      }
      break;
    }
    case 2: {
      LendRef r;
      if (decode_lend_ref(in, &r).is_ok()) {
        pushpull::fuzz::require(r.fd >= 0 && r.offset <= r.block_bytes &&
                                r.bytes <= r.block_bytes - r.offset);
        pushpull::fuzz::require(same(encode_lend_ref(r), in));
      }
      break;
    }
    default: {
      ShmConfirm m;
      if (decode(in, &m).is_ok()) pushpull::fuzz::require(same(encode(m), in));
    }
  }
  return 0;
}
