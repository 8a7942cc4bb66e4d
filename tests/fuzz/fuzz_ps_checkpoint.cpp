// SPDX-License-Identifier: Apache-2.0
// Fuzz target: parameter-server checkpoint files (ps/checkpoint.h) as
// `pushpull launch --resume` and a resuming server read them. Bad bytes must
// throw pushpull::Error; bytes that decode must re-encode to themselves (the
// format has one encoding per content, so anything else is a decoder that
// accepts what the encoder would not write).
#include <cstring>

#include "fuzz_input.h"
#include "ps/checkpoint.h"
#include "pushpull/error.h"

using namespace pushpull;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  (void)sel;
  std::string_view bytes(reinterpret_cast<const char*>(in.data()), in.size());
  ps::Checkpoint c;
  try {
    c = ps::decode_checkpoint(bytes, "<fuzz>", {3, 1, 2});
  } catch (const pushpull::Error&) {
    return 0;
  }
  pushpull::fuzz::require(ps::encode_checkpoint(c) == bytes);
  return 0;
}
