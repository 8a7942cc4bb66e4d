// The handshake at the start of every connection.
//
//   acceptor  -> connector  Challenge {version, job id, 32-byte random nonce}
//   connector -> acceptor   Hello {version, job id, role, rank, advertised host+port,
//                                  HMAC-SHA256(secret, nonce | job id | role | rank)}
//   acceptor  -> connector  HelloAck {accepted?, reason, acceptor role, rank}
//
// The proof is checked only when the acceptor has a job secret; then a hello
// without the right proof is refused. A wrong protocol version or job id is
// refused too. The refused side gets the reason in the ack and does not retry.
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull::net {

using Nonce = std::array<std::byte, 32>;
using Proof = std::array<std::byte, 32>;

struct Challenge {
  uint16_t version = 0;
  std::string job_id;
  Nonce nonce{};
};

struct Hello {
  uint16_t version = 0;
  std::string job_id;
  Role role = Role::kNone;
  int32_t rank = -1;
  std::string host;  // the connector's advertised listening address
  int32_t port = 0;
  Proof proof{};
};

struct HelloAck {
  bool accepted = false;
  std::string reason;
  Role role = Role::kNone;
  int32_t rank = -1;
};

std::vector<std::byte> encode(const Challenge& c);
std::vector<std::byte> encode(const Hello& h);
std::vector<std::byte> encode(const HelloAck& a);
Status decode(std::span<const std::byte> in, Challenge* out);
Status decode(std::span<const std::byte> in, Hello* out);
Status decode(std::span<const std::byte> in, HelloAck* out);

Nonce random_nonce();
// HMAC-SHA256(secret, nonce | job_id | role | rank); all zeros when secret is empty.
Proof compute_proof(const std::string& secret, const Nonce& nonce, const std::string& job_id,
                    Role role, int32_t rank);
// Constant-time comparison.
bool proof_equal(const Proof& a, const Proof& b);

// The acceptor's decision: empty when accepted, else the reason to send back.
std::string check_hello(const Hello& h, const Nonce& nonce, uint16_t my_version,
                        const std::string& my_job_id, const std::string& secret);

}  // namespace pushpull::net
