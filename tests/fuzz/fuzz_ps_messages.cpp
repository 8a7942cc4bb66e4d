// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the parameter-server payloads (ps/protocol.h): init (name +
// value) and pull ranges. What decodes lies inside the input.
#include "fuzz_input.h"
#include "ps/protocol.h"

using namespace pushpull::ps;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  switch (sel % 2) {
    case 0: {
      std::string name;
      std::span<const std::byte> value;
      if (decode_init(in, &name, &value).is_ok()) {
        pushpull::fuzz::require(
            value.empty() ||
            (value.data() >= in.data() && value.data() + value.size() <= in.data() + in.size()));
        pushpull::fuzz::require(name.size() <= in.size());
      }
      break;
    }
    default: {
      std::vector<Range> ranges;
      if (decode_ranges(in, &ranges).is_ok())
        pushpull::fuzz::require(encode_ranges(ranges).size() == in.size());
    }
  }
  return 0;
}
