// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the acceptor's check of a collectives data-stream hello
// (collective/stream_handshake.h check_stream_hello). Byte 0 picks the
// acceptor's rank, the group size and which ranks already have a stream;
// the rest is the hello (zero-padded or cut to its fixed size). Accepted
// means: a rank in range, not taken, whose proof verifies; refused means a
// reason is given.
#include <cstring>

#include "collective/stream_handshake.h"
#include "fuzz_input.h"

using namespace pushpull;

namespace {
// The fixed job of every run (fuzz_seeds.cpp writes hellos for it).
collective::StreamAuth fuzz_auth() {
  return {"fuzz-job", "fuzz-secret", net::Nonce{}, false, nullptr};
}
net::Nonce acceptor_nonce() {
  net::Nonce n{};
  n.fill(std::byte{0x5a});
  return n;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = fuzz::split(data, size);
  const int rank = sel & 3;
  const int group = rank + 1 + ((sel >> 2) & 7);
  std::vector<bool> taken(static_cast<size_t>(group));
  for (int q = 0; q < group; ++q)
    taken[static_cast<size_t>(q)] = (sel >> 5) & (1 << (q % 3));
  std::array<std::byte, collective::kStreamHelloBytes> hello{};
  if (!in.empty()) std::memcpy(hello.data(), in.data(), std::min(in.size(), hello.size()));
  const auto auth = fuzz_auth();
  auto check = collective::check_stream_hello(hello, auth, acceptor_nonce(), rank, group, taken);
  if (check.rank < 0) {
    fuzz::require(!check.refusal.empty());
    return 0;
  }
  fuzz::require(check.rank > rank && check.rank < group && !taken[static_cast<size_t>(check.rank)]);
  net::Nonce theirs;
  net::Proof proof;
  std::memcpy(theirs.data(), hello.data() + 8, theirs.size());
  std::memcpy(proof.data(), hello.data() + 8 + theirs.size(), proof.size());
  fuzz::require(net::verify_proof(auth.key(),
                                  {net::Direction::kConnector, acceptor_nonce(), theirs,
                                   auth.job_id, Role::kWorker, check.rank},
                                  proof));
  return 0;
}
