// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the parameter-server payloads (ps/protocol.h): init (name +
// value), pull ranges, replica metadata and a lent replica with its
// metadata. What decodes lies inside the input and encodes back to it.
#include "fuzz_input.h"
#include "ps/protocol.h"

using namespace pushpull::ps;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  switch (sel % 4) {
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
    case 2: {
      ReplicaState st;
      if (decode_replica_meta(in, 8, &st).is_ok()) {
        pushpull::fuzz::require(st.applied_seq.size() <= 8);
        pushpull::fuzz::require(encode_replica_meta(st).size() == in.size());
      }
      break;
    }
    case 3: {
      pushpull::transport::LendRef ref;
      ReplicaState st;
      if (decode_lent_replica(in, 8, &ref, &st).is_ok()) {
        pushpull::fuzz::require(ref.offset <= ref.block_bytes &&
                                ref.bytes <= ref.block_bytes - ref.offset);
        pushpull::fuzz::require(encode_lent_replica(ref, st).size() == in.size());
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
