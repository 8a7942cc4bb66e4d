#include "net/hello.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <fmt/format.h>

#include <random>

#include "net/wire.h"

namespace pushpull::net {

std::vector<std::byte> encode(const Challenge& c) {
  Writer w;
  w.u<uint16_t>(c.version).str(c.job_id).bytes(c.nonce);
  return w.take();
}
std::vector<std::byte> encode(const Hello& h) {
  Writer w;
  w.u<uint16_t>(h.version)
      .str(h.job_id)
      .u<uint8_t>(static_cast<uint8_t>(h.role))
      .u<int32_t>(h.rank)
      .str(h.host)
      .u<int32_t>(h.port)
      .bytes(h.proof);
  return w.take();
}
std::vector<std::byte> encode(const HelloAck& a) {
  Writer w;
  w.u<uint8_t>(a.accepted ? 1 : 0)
      .str(a.reason)
      .u<uint8_t>(static_cast<uint8_t>(a.role))
      .u<int32_t>(a.rank);
  return w.take();
}

namespace {
Status malformed(const char* what) {
  return {ErrorCode::kProtocolError, fmt::format("malformed {} message", what)};
}
bool valid_role(uint8_t r) {
  return r <= static_cast<uint8_t>(Role::kWorker);
}
}  // namespace

Status decode(std::span<const std::byte> in, Challenge* out) {
  Reader r(in);
  out->version = r.u<uint16_t>();
  out->job_id = r.str();
  r.bytes(out->nonce);
  return r.ok() && r.at_end() ? Status{} : malformed("challenge");
}
Status decode(std::span<const std::byte> in, Hello* out) {
  Reader r(in);
  out->version = r.u<uint16_t>();
  out->job_id = r.str();
  auto role = r.u<uint8_t>();
  out->rank = r.u<int32_t>();
  out->host = r.str();
  out->port = r.u<int32_t>();
  r.bytes(out->proof);
  if (!r.ok() || !r.at_end() || !valid_role(role)) return malformed("hello");
  out->role = static_cast<Role>(role);
  return {};
}
Status decode(std::span<const std::byte> in, HelloAck* out) {
  Reader r(in);
  out->accepted = r.u<uint8_t>() != 0;
  out->reason = r.str();
  auto role = r.u<uint8_t>();
  out->rank = r.u<int32_t>();
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

Proof compute_proof(const std::string& secret, const Nonce& nonce, const std::string& job_id,
                    Role role, int32_t rank) {
  Proof p{};
  if (secret.empty()) return p;
  Writer w;
  w.bytes(nonce).str(job_id).u<uint8_t>(static_cast<uint8_t>(role)).u<int32_t>(rank);
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(w.data().data()), w.data().size(),
       reinterpret_cast<unsigned char*>(p.data()), &len);
  return p;
}

bool proof_equal(const Proof& a, const Proof& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string check_hello(const Hello& h, const Nonce& nonce, uint16_t my_version,
                        const std::string& my_job_id, const std::string& secret) {
  if (h.version != my_version)
    return fmt::format(
        "protocol version mismatch: the connecting node speaks version {}, this "
        "node version {}; run the same pushpull release everywhere",
        h.version, my_version);
  if (h.job_id != my_job_id)
    return fmt::format(
        "job id mismatch: the connecting node belongs to job '{}', this node to "
        "job '{}'; check PUSHPULL_JOB_ID and the scheduler address",
        h.job_id, my_job_id);
  if (!secret.empty() &&
      !proof_equal(h.proof, compute_proof(secret, nonce, h.job_id, h.role, h.rank)))
    return "authentication failed: the connecting node does not know this job's secret; set the "
           "same PUSHPULL_JOB_SECRET on every node";
  return {};
}

}  // namespace pushpull::net
