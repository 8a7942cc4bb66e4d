// Fuzz target: the collective engine's control messages
// (collective/messages.h): a rank's announce and rank 0's responses. Bad
// input must throw pushpull::Error (ProtocolError); anything else escaping
// (bad_alloc, length_error, a crash) is a finding.
#include <string_view>

#include "collective/messages.h"
#include "fuzz_input.h"
#include "pushpull/error.h"

using namespace pushpull::collective;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  std::string_view bytes(reinterpret_cast<const char*>(in.data()), in.size());
  const int ranks = 1 + (sel >> 1) % 8;
  try {
    if (sel % 2 == 0)
      (void)decode_announce(bytes, ranks);
    else
      (void)decode_responses(bytes, ranks);
  } catch (const pushpull::Error&) {
  }
  return 0;
}
