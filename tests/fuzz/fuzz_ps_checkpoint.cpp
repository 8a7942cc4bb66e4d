// SPDX-License-Identifier: Apache-2.0
// Fuzz target: parameter-server checkpoint files (ps/checkpoint.h) as
// `pushpull launch --resume` and a resuming server read them. Bad bytes must
// throw pushpull::Error.
//
// A file's last 32 bytes are an HMAC-SHA256 tag the fuzzer cannot forge, so
// selector bit 0 clear: the input is a file without its tag, and the target
// appends the tag under a fixed key before decoding (reaching the parser
// behind the tag); bytes that decode must re-encode to themselves (the
// format has one encoding per content, so anything else is a decoder that
// accepts what the encoder would not write). Bit 0 set: the input is decoded
// as it is, with unauthenticated (version 1) files allowed: the legacy
// parser and the refusal of a tag that does not verify. Seeds: fuzz_seeds.
#include <cstring>

#include "base/file_auth.h"
#include "fuzz_input.h"
#include "ps/checkpoint.h"
#include "pushpull/error.h"

using namespace pushpull;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const base::FileKey key = base::file_key_from_secret("fuzz", "<fuzz key>");
  static const base::FileKey legacy = [] {
    base::FileKey k = key;
    k.allow_unauthenticated = true;
    return k;
  }();
  auto [sel, in] = pushpull::fuzz::split(data, size);
  std::string bytes(reinterpret_cast<const char*>(in.data()), in.size());
  const bool raw = (sel & 1) != 0;
  if (!raw) bytes += key.tag(bytes);
  ps::Checkpoint c;
  try {
    c = ps::decode_checkpoint(bytes, "<fuzz>", {3, 1, 2}, raw ? legacy : key);
  } catch (const pushpull::Error&) {
    return 0;
  }
  if (!raw) pushpull::fuzz::require(ps::encode_checkpoint(c, key) == bytes);
  return 0;
}
