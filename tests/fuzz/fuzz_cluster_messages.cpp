// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the cluster control payloads (cluster/protocol.h): register,
// address book, peer dead. Whatever decodes re-encodes to as many bytes.
#include "cluster/protocol.h"
#include "fuzz_input.h"

using namespace pushpull::cluster;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  switch (sel % 3) {
    case 0: {
      NodeAddress me;
      int32_t preferred = 0;
      if (decode_register(in, &me, &preferred).is_ok())
        pushpull::fuzz::require(encode_register(me, preferred).size() == in.size());
      break;
    }
    case 1: {
      int32_t rank = 0;
      AddressBook book;
      if (decode_book(in, &rank, &book).is_ok())
        pushpull::fuzz::require(encode_book(rank, book).size() == in.size());
      break;
    }
    default: {
      NodeAddress who;
      std::string reason;
      if (decode_dead(in, &who, &reason).is_ok())
        pushpull::fuzz::require(encode_dead(who, reason).size() == in.size());
    }
  }
  return 0;
}
