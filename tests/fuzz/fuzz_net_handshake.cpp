// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the handshake messages (transport/hello.h): challenge, hello, ack.
// A hello that decodes re-encodes to as many bytes as it came in. Selector
// 3: the acceptor's check of a hello for a fixed job (fuzz_seeds writes
// hellos with right proofs): accepted exactly when its proof is right for
// the kind it asks for (a message connection or a data stream), and such a
// proof is never right for the other kind.
#include "fuzz_input.h"
#include "transport/hello.h"

using namespace pushpull::transport;

namespace {
void check_proof_binding(std::span<const std::byte> in) {
  Hello h;
  if (!decode(in, &h).is_ok()) return;
  Nonce acceptor{};
  acceptor.fill(std::byte{0x5a});
  const std::string job = "fuzz-job", secret = "fuzz-secret";
  const bool accepted = check_hello(h, acceptor, h.version, job, secret).is_ok();
  ProofInput for_kind{Direction::kConnector, acceptor, h.nonce, job, h.role, h.rank, h.kind};
  const bool right = verify_proof(secret, for_kind, h.proof);
  pushpull::fuzz::require(!accepted || right);
  if (!right) return;
  ProofInput other = for_kind;
  other.kind = h.kind == HelloKind::kStream ? HelloKind::kMessages : HelloKind::kStream;
  pushpull::fuzz::require(!verify_proof(secret, other, h.proof));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  switch (sel % 4) {
    case 0: {
      Challenge c;
      if (decode(in, &c).is_ok()) pushpull::fuzz::require(encode(c).size() == in.size());
      break;
    }
    case 1: {
      Hello h;
      if (decode(in, &h).is_ok()) pushpull::fuzz::require(encode(h).size() == in.size());
      break;
    }
    case 3:
      check_proof_binding(in);
      break;
    default: {
      HelloAck a;
      if (decode(in, &a).is_ok()) pushpull::fuzz::require(encode(a).size() == in.size());
    }
  }
  return 0;
}
