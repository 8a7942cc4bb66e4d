// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the same-host records and setup messages: a host record (the
// PS's offer, transport/host_identity.h), the PS's answer
// (transport/shm/shm_setup.h), a collective rank's record (transport/shm/shm_host.h)
// and a lent block's reference (transport/shm/lend.h). One that decodes
// re-encodes to the same bytes, and a lent range lies inside its block.
#include <algorithm>

#include "fuzz_input.h"
#include "pushpull/error.h"
#include "transport/shm/lend.h"
#include "transport/shm/shm_host.h"
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
      HostRecord m;
      if (decode(in, &m).is_ok())
        pushpull::fuzz::require(m.key.size() <= 255 && same(encode(m), in));
      break;
    }
    case 1: {
      ShmAnswer m;
      if (decode(in, &m).is_ok()) pushpull::fuzz::require(same(encode(m), in));
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
      const auto* p = reinterpret_cast<const uint8_t*>(in.data());
      try {
        const auto wire =
            pushpull::transport::encode(pushpull::transport::decode_rank_record(p, in.size()));
        pushpull::fuzz::require(std::equal(wire.begin(), wire.end(), p, p + in.size()));
      } catch (const pushpull::ProtocolError&) {
      }
    }
  }
  return 0;
}
