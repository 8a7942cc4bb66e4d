// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the group's meeting (collective/store.h, tcp_store.h): the
// MASTER_ADDR store's requests (set, get), a rank's entry and rank 0's
// verdict (an address list or a reason). Whatever decodes re-encodes to as
// many bytes.
#include "collective/store.h"
#include "collective/tcp_store.h"
#include "fuzz_input.h"

using namespace pushpull::collective;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  std::span<const std::byte> bytes(in.data(), in.size());
  switch (sel % 3) {
    case 0: {
      std::string key;
      std::vector<std::byte> value;
      const bool with_value = (sel / 3) % 2 == 0;
      if (decode_store_request(bytes, with_value, &key, &value).is_ok())
        pushpull::fuzz::require(encode_store_request(key, value).size() == in.size());
      break;
    }
    case 1: {
      int ranks = 0, port = 0;
      std::string host;
      if (decode_entry(bytes, &ranks, &host, &port).is_ok())
        pushpull::fuzz::require(encode_entry(ranks, host, port).size() == in.size());
      break;
    }
    default: {
      pushpull::Status verdict;
      AddressList book;
      if (decode_verdict(bytes, &verdict, &book).is_ok())
        pushpull::fuzz::require(encode_verdict(verdict, book).size() == in.size());
    }
  }
  return 0;
}
