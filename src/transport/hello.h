// SPDX-License-Identifier: Apache-2.0
// The handshake at the start of every connection: mutual authentication
// bound to identity.
//
//   acceptor  -> connector  Challenge {version, job tag, acceptor nonce}
//   connector -> acceptor   Hello {version, job tag, role, rank, advertised host+port,
//                                  connector nonce, connector proof, kind}
//   acceptor  -> connector  HelloAck {accepted?, reason, acceptor role, rank, acceptor proof}
//
// Nonces are 32 fresh random bytes (RAND_bytes) per connection and side. The
// job tag is SHA-256 of the job id (the id itself never travels in clear).
// A proof is HMAC-SHA256(job secret, direction label | acceptor nonce |
// connector nonce | job id | prover's role | prover's rank | kind): it binds
// both nonces (no replay), the direction (a connector's proof cannot be
// reflected as an acceptor's), the prover's claimed identity (a proof for
// worker 1 does not admit worker 2) and the kind of connection asked for (a
// message connection's proof cannot open a data stream, nor the reverse). The acceptor checks the
// connector's proof before accepting; the connector checks the acceptor's proof in the ack before
// it uses the connection. Without a secret proofs are all zeros and only the version and job tag
// are checked (transport/peer_policy.h then limits the peers a node accepts and dials to this
// machine; Options::from_env() leaves the secret empty only with PUSHPULL_ALLOW_INSECURE=1). The
// refused side gets the reason in the ack and does not retry.
//
// This authenticates who is at the other end when the connection opens; it
// does not encrypt or sign the traffic that follows (an attacker on the path
// can still read it or take over an open connection).
//
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull::transport {

using Nonce = std::array<std::byte, 32>;
using Proof = std::array<std::byte, 32>;
using JobTag = std::array<std::byte, 32>;

// Longest advertised host name a hello may carry.
inline constexpr size_t kMaxHelloHost = 255;
// The largest hello: the acceptor's cap on input before authentication.
inline constexpr size_t kMaxHelloBytes = 2 + 32 + 1 + 4 + (4 + kMaxHelloHost) + 4 + 32 + 32 + 1;

// What the connector asks for (protocol version 4): a message connection
// served by the acceptor's MessageTransport, or a data stream that the
// acceptor hands, once accepted, to its owner (transport/tcp/message_transport.h, "Streams").
enum class HelloKind : uint8_t { kMessages = 0, kStream = 1 };
// Upper bound of any handshake payload (challenge, hello, ack with its
// reason): the connector's cap on what an acceptor sends before the ack.
inline constexpr size_t kMaxHandshakeBytes = 1024;

struct Challenge {
  uint16_t version = 0;
  JobTag job_tag{};
  Nonce nonce{};  // the acceptor's
};

struct Hello {
  uint16_t version = 0;
  JobTag job_tag{};
  Role role = Role::kNone;
  int32_t rank = -1;
  std::string host;  // the connector's advertised listening address
  int32_t port = 0;
  Nonce nonce{};  // the connector's
  Proof proof{};
  HelloKind kind = HelloKind::kMessages;
};

struct HelloAck {
  bool accepted = false;
  std::string reason;
  Role role = Role::kNone;
  int32_t rank = -1;
  Proof proof{};  // the acceptor's (zeros when refused)
};

std::vector<std::byte> encode(const Challenge& c);
std::vector<std::byte> encode(const Hello& h);
std::vector<std::byte> encode(const HelloAck& a);
Status decode(std::span<const std::byte> in, Challenge* out);
Status decode(std::span<const std::byte> in, Hello* out);
Status decode(std::span<const std::byte> in, HelloAck* out);

Nonce random_nonce();
JobTag job_tag(const std::string& job_id);

// Who proves: the side that connected or the side that accepted.
enum class Direction : uint8_t { kConnector = 1, kAcceptor = 2 };

// What a proof is about: both nonces, the job and the prover's identity.
struct ProofInput {
  Direction direction = Direction::kConnector;
  Nonce acceptor_nonce{};
  Nonce connector_nonce{};
  std::string job_id;
  Role role = Role::kNone;                // the prover's
  int32_t rank = -1;                      // the prover's
  HelloKind kind = HelloKind::kMessages;  // of the connection both sides prove for
};

// HMAC-SHA256(secret, input); all zeros when `secret` is empty. Used by the
// MessageTransport's hello, for message connections and data streams alike.
Proof compute_proof(const std::string& secret, const ProofInput& input);
// Constant-time comparison.
bool proof_equal(const Proof& a, const Proof& b);
// True when `proof` is right for `input` (always true without a secret).
bool verify_proof(const std::string& secret, const ProofInput& input, const Proof& proof);

// What to do when proofs fail between hosts: the secrets differ, most often
// because each host made its own per-user secret file (no shared home).
inline constexpr const char* kSecretAdvice =
    "set the same PUSHPULL_JOB_SECRET or PUSHPULL_JOB_SECRET_FILE on every host, or give every "
    "host the same per-user secret file (~/.config/pushpull/secret, e.g. a shared home; "
    "docs/security.md)";
// Where this node's secret came from, for errors: NetOptions::job_secret_source.
std::string secret_source(const NetOptions& opts);

// The acceptor's decision on a decoded hello: ok when accepted, else a
// ProtocolError whose message (at most kMaxReason bytes) is the reason to
// send back. `acceptor_nonce` is the one of its challenge.
Status check_hello(const Hello& h, const Nonce& acceptor_nonce, uint16_t my_version,
                   const std::string& my_job_id, const std::string& secret);

}  // namespace pushpull::transport
