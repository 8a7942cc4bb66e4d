// SPDX-License-Identifier: Apache-2.0
#include "transport/hello.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <fmt/format.h>

#include <random>

#include "transport/wire.h"

namespace pushpull::transport {

std::vector<std::byte> encode(const Challenge& c) {
  Writer w;
  w.u<uint16_t>(c.version).bytes(c.job_tag).bytes(c.nonce);
  return w.take();
}
std::vector<std::byte> encode(const Hello& h) {
  Writer w;
  w.u<uint16_t>(h.version)
      .bytes(h.job_tag)
      .u<uint8_t>(static_cast<uint8_t>(h.role))
      .u<int32_t>(h.rank)
      .str(h.host)
      .u<int32_t>(h.port)
      .bytes(h.nonce)
      .bytes(h.proof)
      .u<uint8_t>(static_cast<uint8_t>(h.kind));
  return w.take();
}
std::vector<std::byte> encode(const HelloAck& a) {
  Writer w;
  w.u<uint8_t>(a.accepted ? 1 : 0)
      .str(a.reason)
      .u<uint8_t>(static_cast<uint8_t>(a.role))
      .u<int32_t>(a.rank)
      .bytes(a.proof);
  return w.take();
}

namespace {
Status malformed(const char* what) {
  return {ErrorCode::kProtocolError, fmt::format("malformed {} message", what)};
}
bool valid_role(uint8_t r) {
  return r <= static_cast<uint8_t>(Role::kWorker);
}
bool valid_kind(uint8_t k) {
  return k <= static_cast<uint8_t>(HelloKind::kStream);
}
// Longest refusal reason an ack carries (keeps the ack under kMaxHandshakeBytes).
constexpr size_t kMaxReason = 700;
}  // namespace

Status decode(std::span<const std::byte> in, Challenge* out) {
  Reader r(in);
  out->version = r.u<uint16_t>();
  r.bytes(out->job_tag);
  r.bytes(out->nonce);
  return r.ok() && r.at_end() ? Status{} : malformed("challenge");
}
Status decode(std::span<const std::byte> in, Hello* out) {
  Reader r(in);
  out->version = r.u<uint16_t>();
  r.bytes(out->job_tag);
  auto role = r.u<uint8_t>();
  out->rank = r.u<int32_t>();
  out->host = r.str(kMaxHelloHost);
  out->port = r.u<int32_t>();
  r.bytes(out->nonce);
  r.bytes(out->proof);
  auto kind = r.u<uint8_t>();
  if (!r.ok() || !r.at_end() || !valid_role(role) || !valid_kind(kind)) return malformed("hello");
  out->role = static_cast<Role>(role);
  out->kind = static_cast<HelloKind>(kind);
  return {};
}
Status decode(std::span<const std::byte> in, HelloAck* out) {
  Reader r(in);
  out->accepted = r.u<uint8_t>() != 0;
  out->reason = r.str(kMaxHandshakeBytes);
  auto role = r.u<uint8_t>();
  out->rank = r.u<int32_t>();
  r.bytes(out->proof);
  if (!r.ok() || !r.at_end() || !valid_role(role)) return malformed("hello ack");
  out->role = static_cast<Role>(role);
  return {};
}

Nonce random_nonce() {
  Nonce n;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    std::random_device rd;  // fallback; the nonce only needs to be unpredictable
    for (auto& b : n)
      b = static_cast<std::byte>(rd());
  }
  return n;
}

JobTag job_tag(const std::string& job_id) {
  static constexpr char kLabel[] = "pushpull job id\n";
  JobTag t{};
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  unsigned int len = 0;
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, kLabel, sizeof kLabel - 1);
  EVP_DigestUpdate(ctx, job_id.data(), job_id.size());
  EVP_DigestFinal_ex(ctx, reinterpret_cast<unsigned char*>(t.data()), &len);
  EVP_MD_CTX_free(ctx);
  return t;
}

Proof compute_proof(const std::string& secret, const ProofInput& in) {
  Proof p{};
  if (secret.empty()) return p;
  Writer w;
  w.str(in.direction == Direction::kConnector ? "pushpull v2 connector" : "pushpull v2 acceptor")
      .bytes(in.acceptor_nonce)
      .bytes(in.connector_nonce)
      .str(in.job_id)
      .u<uint8_t>(static_cast<uint8_t>(in.role))
      .u<int32_t>(in.rank)
      .u<uint8_t>(static_cast<uint8_t>(in.kind));
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(w.data().data()), w.data().size(),
       reinterpret_cast<unsigned char*>(p.data()), &len);
  return p;
}

bool proof_equal(const Proof& a, const Proof& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool verify_proof(const std::string& secret, const ProofInput& input, const Proof& proof) {
  return secret.empty() || proof_equal(proof, compute_proof(secret, input));
}

Status check_hello(const Hello& h, const Nonce& acceptor_nonce, uint16_t my_version,
                   const std::string& my_job_id, const std::string& secret) {
  std::string reason;
  if (h.version != my_version)
    reason = fmt::format(
        "protocol version mismatch: the connecting node speaks version {}, this "
        "node version {}; run the same pushpull release everywhere",
        h.version, my_version);
  else if (CRYPTO_memcmp(h.job_tag.data(), job_tag(my_job_id).data(), h.job_tag.size()) != 0)
    reason =
        "job id mismatch: the connecting node belongs to another job; check PUSHPULL_JOB_ID and "
        "the scheduler address";
  else if (!verify_proof(
               secret,
               {Direction::kConnector, acceptor_nonce, h.nonce, my_job_id, h.role, h.rank, h.kind},
               h.proof))
    reason = std::string(
                 "authentication failed: the connecting node does not know this job's secret; ") +
             kSecretAdvice;
  if (reason.empty()) return Status::ok();
  if (reason.size() > kMaxReason) reason.resize(kMaxReason);
  return {ErrorCode::kProtocolError, std::move(reason)};
}

std::string secret_source(const NetOptions& opts) {
  if (opts.job_secret.empty()) return "no secret";
  return opts.job_secret_source.empty() ? "set by the program" : opts.job_secret_source;
}

}  // namespace pushpull::transport
