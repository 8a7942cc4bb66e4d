// SPDX-License-Identifier: Apache-2.0
#include "base/file_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <fmt/format.h>

#include "base/hex.h"
#include "base/secret_file.h"
#include "pushpull/error.h"

namespace pushpull::base {
namespace {

constexpr std::string_view kKeyLabel = "pushpull checkpoint v2";
constexpr std::string_view kIdLabel = "pushpull checkpoint key id";

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), out,
           &len) == nullptr ||
      len != kFileTagBytes)
    throw IoError("OpenSSL HMAC-SHA256 failed");
  return std::string(reinterpret_cast<const char*>(out), len);
}

bool is_on(const std::optional<std::string>& v) {
  return v && (*v == "1" || *v == "true" || *v == "yes" || *v == "on");
}

}  // namespace

std::string FileKey::id_hex() const {
  return to_hex(id.data(), id.size());
}

std::string FileKey::tag(std::string_view bytes) const {
  if (key.empty()) throw InvalidArgument("no checkpoint key (base::checkpoint_key)");
  return hmac_sha256(key, bytes);
}

bool FileKey::verify(std::string_view bytes, std::string_view t) const {
  if (t.size() != kFileTagBytes) return false;
  const std::string want = tag(bytes);
  return CRYPTO_memcmp(want.data(), t.data(), kFileTagBytes) == 0;
}

std::string FileKey::describe() const {
  return fmt::format("key id {}, from {}", id_hex(), source);
}

std::string FileKey::mismatch_hint() const {
  return fmt::format(
      "if it was written on another host, every host must read the same secret: a home "
      "directory shared by the hosts, the same secret file{} copied to each (mode 0600), or "
      "PUSHPULL_CHECKPOINT_KEY_FILE naming the same secret file on every host (pushpull launch "
      "passes it on to its servers)",
      secret_path.empty() ? std::string() : " " + secret_path);
}

FileKey file_key_from_secret(std::string_view secret, std::string source, std::string secret_path) {
  if (secret.empty()) throw InvalidArgument(fmt::format("the secret from {} is empty", source));
  FileKey k;
  k.key = hmac_sha256(secret, kKeyLabel);
  k.id = hmac_sha256(k.key, kIdLabel).substr(0, kFileKeyIdBytes);
  k.source = std::move(source);
  k.secret_path = std::move(secret_path);
  return k;
}

FileKey checkpoint_key(const Environment& env) {
  FileKey k;
  if (auto f = env.get("PUSHPULL_CHECKPOINT_KEY_FILE"); f && !f->empty()) {
    k = file_key_from_secret(read_secret_file(*f), "PUSHPULL_CHECKPOINT_KEY_FILE=" + *f, *f);
  } else {
    UserSecret s = user_secret(env);
    k = file_key_from_secret(s.secret, "the per-user secret file " + s.path, s.path);
  }
  k.allow_unauthenticated = is_on(env.get("PUSHPULL_ALLOW_INSECURE"));
  return k;
}

void check_key_id(const FileKey& key, const Environment& env, std::string_view who) {
  auto want = env.get("PUSHPULL_CHECKPOINT_KEY_ID");
  if (!want || want->empty() || *want == key.id_hex()) return;
  throw InvalidArgument(fmt::format(
      "{}: the launcher's checkpoint key has id {}, this host's has another ({}): the "
      "checkpoints written here could not be resumed from (they would be refused as written by "
      "another user or with another secret); {}",
      who, *want, key.describe(), key.mismatch_hint()));
}

}  // namespace pushpull::base
