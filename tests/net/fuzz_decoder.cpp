// libFuzzer target for the wire decoders: the message header and every
// handshake and cluster-control payload. Built with clang -fsanitize=fuzzer
// by tests/net/tests.cmake; ctest runs it briefly, run it longer by hand:
//   build/bin/fuzz_decoder -max_total_time=600
// Inputs: byte 0 picks the decoder, the rest is the data.
#include <cstddef>
#include <cstdint>
#include <span>

#include "net/hello.h"
#include "net/message.h"

using namespace pushpull::net;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  switch (data[0] % 4) {
    case 0: {
      if (in.size() < kHeaderBytes) return 0;
      Header h;
      if (decode_header(in.first<kHeaderBytes>(), uint64_t{1} << 31, &h).is_ok()) {
        // A decoded header re-encodes to the same bytes.
        HeaderBytes again = encode_header(h);
        for (size_t i = 0; i < kHeaderBytes; ++i)
          if (again[i] != in[i]) __builtin_trap();
        if (h.payload_bytes > (uint64_t{1} << 31)) __builtin_trap();
      }
      break;
    }
    case 1: {
      Challenge c;
      (void)decode(in, &c);
      break;
    }
    case 2: {
      Hello h;
      if (decode(in, &h).is_ok() && encode(h).size() != in.size()) __builtin_trap();
      break;
    }
    default: {
      HelloAck a;
      (void)decode(in, &a);
    }
  }
  return 0;
}
