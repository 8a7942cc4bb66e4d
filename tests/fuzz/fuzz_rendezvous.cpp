// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the collective rendezvous messages (collective/rendezvous.h):
// a rank's hello and rank 0's address book. Whatever decodes re-encodes to
// as many bytes.
#include "collective/rendezvous.h"
#include "fuzz_input.h"

using namespace pushpull::collective;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  if (sel % 2 == 0) {
    int rank = 0, ranks = 0, port = 0;
    std::string host;
    if (decode_hello(in.data(), in.size(), &rank, &ranks, &host, &port).is_ok())
      pushpull::fuzz::require(encode_hello(rank, ranks, host, port).size() == in.size());
  } else {
    AddressList book;
    if (decode_book(in.data(), in.size(), &book).is_ok())
      pushpull::fuzz::require(encode_book(book).size() == in.size());
  }
  return 0;
}
