// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the handshake messages (net/hello.h): challenge, hello, ack.
// A hello that decodes re-encodes to as many bytes as it came in.
#include "fuzz_input.h"
#include "net/hello.h"

using namespace pushpull::net;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  switch (sel % 3) {
    case 0: {
      Challenge c;
      if (decode(in, &c).is_ok()) pushpull::fuzz::require(encode(c).size() == in.size());
      break;
    }
    case 1: {
      Hello h;
      if (decode(in, &h).is_ok()) pushpull::fuzz::require(encode(h).size() == in.size());
      break;
    }
    default: {
      HelloAck a;
      if (decode(in, &a).is_ok()) pushpull::fuzz::require(encode(a).size() == in.size());
    }
  }
  return 0;
}
