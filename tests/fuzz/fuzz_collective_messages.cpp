// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the collective engine's control messages
// (collective/messages.h): a rank's announce, rank 0's responses and a
// child's message to its parent in the negotiation tree (every input goes
// through that decoder too), through
// the Status-returning decoders (what decodes re-encodes to as many bytes)
// and the throwing ones (bad input must throw pushpull::Error; anything else
// escaping — bad_alloc, length_error, a crash — is a finding).
#include <string_view>

#include "collective/messages.h"
#include "fuzz_input.h"
#include "pushpull/error.h"

using namespace pushpull::collective;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  const int ranks = 1 + (sel >> 2) % 8;
  if (sel & 2) {
    std::string_view bytes(reinterpret_cast<const char*>(in.data()), in.size());
    try {
      if (sel % 2 == 0)
        (void)decode_announce(bytes, ranks);
      else
        (void)decode_responses(bytes, ranks);
    } catch (const pushpull::Error&) {
    }
    try {
      (void)decode_upward(bytes, ranks);
    } catch (const pushpull::Error&) {
    }
    return 0;
  }
  Upward u;
  if (decode_upward(in, ranks, &u).is_ok()) pushpull::fuzz::require(encode(u).size() == in.size());
  if (sel % 2 == 0) {
    Announce a;
    if (decode_announce(in, ranks, &a).is_ok())
      pushpull::fuzz::require(encode(a).size() == in.size());
  } else {
    std::vector<Response> rs;
    if (decode_responses(in, ranks, &rs).is_ok())
      pushpull::fuzz::require(encode(rs).size() == in.size());
  }
  return 0;
}
