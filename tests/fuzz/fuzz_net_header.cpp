// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the 64-byte message header (transport/message.h decode_header).
// A header that decodes re-encodes to the same bytes and respects the cap.
#include "fuzz_input.h"
#include "transport/message.h"

using namespace pushpull::transport;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  if (in.size() < kHeaderBytes) return 0;
  const uint64_t cap = sel % 2 ? uint64_t{1} << 31 : UINT64_MAX;
  Header h;
  if (decode_header(in.first<kHeaderBytes>(), cap, &h).is_ok()) {
    HeaderBytes again = encode_header(h);
    for (size_t i = 0; i < kHeaderBytes; ++i)
      pushpull::fuzz::require(again[i] == in[i]);
    pushpull::fuzz::require(h.payload_bytes <= cap);
  }
  return 0;
}
