// SPDX-License-Identifier: Apache-2.0
#include "kvstore/states_file.h"

#include <cstring>

#include <fmt/format.h>

#include "pushpull/error.h"
#include "pushpull/log.h"
#include "transport/wire.h"

namespace pushpull::kv {
namespace {

constexpr char kMagic[4] = {'P', 'P', 'D', 'S'};
constexpr uint32_t kVersion = 2;        // authenticated (HMAC-SHA256 tag)
constexpr uint32_t kLegacyVersion = 1;  // no tag
constexpr size_t kTag = base::kFileTagBytes;
constexpr size_t kKeyId = base::kFileKeyIdBytes;
constexpr size_t kHead = sizeof kMagic + 4;  // magic, version

IoError not_a_states_file(std::string_view source, std::string_view why) {
  return IoError(fmt::format(
      "load_optimizer_states: '{}' is not a distributed optimizer-state file ({})", source, why));
}

IoError refused(std::string_view source, std::string_view why) {
  return IoError(fmt::format("load_optimizer_states: '{}': {}", source, why));
}

// u32 servers, then per server a u64-length-prefixed blob, nothing after.
std::vector<std::string> decode_body(std::string_view body, std::string_view source, int servers) {
  transport::Reader r(std::as_bytes(std::span(body.data(), body.size())));
  const uint32_t count = r.u<uint32_t>();
  if (!r.ok()) throw not_a_states_file(source, "truncated");
  if (static_cast<int64_t>(count) != servers)
    throw InvalidArgument(fmt::format(
        "load_optimizer_states: '{}' was saved by a job with {} servers; this job has {}", source,
        count, servers));
  std::vector<std::string> per_server;
  for (uint32_t s = 0; s < count && r.ok(); ++s)
    per_server.push_back(r.str<uint64_t>(body.size()));
  if (!r.ok()) throw not_a_states_file(source, "truncated");
  if (!r.done()) throw not_a_states_file(source, "trailing bytes");
  return per_server;
}

}  // namespace

std::string encode_states_file(const std::vector<std::string>& per_server,
                               const base::FileKey& key) {
  if (key.key.empty() || key.id.size() != kKeyId)
    throw InvalidArgument("save_optimizer_states: no checkpoint key");
  transport::Writer w;
  w.bytes(std::as_bytes(std::span(kMagic, sizeof kMagic)));
  w.u<uint32_t>(kVersion);
  w.bytes(std::as_bytes(std::span(key.id.data(), key.id.size())));
  w.u<uint32_t>(static_cast<uint32_t>(per_server.size()));
  for (const auto& s : per_server)
    w.str<uint64_t>(s);
  std::string out(reinterpret_cast<const char*>(w.data().data()), w.data().size());
  out += key.tag(out);
  return out;
}

std::vector<std::string> decode_states_file(std::string_view bytes, std::string_view source,
                                            int servers, const base::FileKey& key) {
  if (bytes.size() < kHead) {
    if (bytes.size() >= sizeof kMagic && std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
      throw not_a_states_file(source, "bad magic");
    throw not_a_states_file(source, "truncated");
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    throw not_a_states_file(source, "bad magic");
  uint32_t version;
  std::memcpy(&version, bytes.data() + sizeof kMagic, 4);
  if (version == kLegacyVersion) {
    // Unauthenticated: anyone who could write the file's directory could have made it.
    if (!key.allow_unauthenticated)
      throw refused(
          source,
          "format version 1 is not authenticated (it carries no tag of your checkpoint key, so "
          "it may have been written by anyone), and this build reads it only with "
          "PUSHPULL_ALLOW_INSECURE=1: if you trust the file, load it once with "
          "PUSHPULL_ALLOW_INSECURE=1 and save the states again; files saved now are "
          "authenticated (version 2)");
    PP_WARN(
        "optimizer states '{}': format version 1 is not authenticated; read because "
        "PUSHPULL_ALLOW_INSECURE=1",
        source);
    return decode_body(bytes.substr(kHead), source, servers);
  }
  if (version != kVersion)
    throw not_a_states_file(
        source, fmt::format("format version {}; this build reads version {}", version, kVersion));
  if (bytes.size() < kHead + kKeyId + kTag) throw not_a_states_file(source, "truncated");
  const std::string_view id = bytes.substr(kHead, kKeyId);
  const std::string_view body = bytes.substr(0, bytes.size() - kTag);
  if (!key.verify(body, bytes.substr(bytes.size() - kTag))) {
    if (id != key.id)
      throw refused(
          source,
          fmt::format("not authenticated: written by another user or with another secret (its "
                      "key id is {}; this process's {}); refused; {}",
                      base::FileKey{{}, std::string(id), {}, {}, false}.id_hex(), key.describe(),
                      key.mismatch_hint()));
    throw refused(source,
                  "authentication tag mismatch: the file is torn, corrupt or was modified after "
                  "it was written; refused");
  }
  // Only a holder of the key could write this (one encoding per content).
  if (id != key.id) throw refused(source, "its key id does not match the key that tagged it");
  return decode_body(body.substr(kHead + kKeyId), source, servers);
}

}  // namespace pushpull::kv
