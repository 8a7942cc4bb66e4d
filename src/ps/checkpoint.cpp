// SPDX-License-Identifier: Apache-2.0
#include "ps/checkpoint.h"

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "base/file_codec.h"
#include "base/private_file.h"
#include "pushpull/checked.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

namespace pushpull::ps {
namespace {

using base::put_le;

constexpr char kMagic[8] = {'P', 'P', 'C', 'K', 'P', 'T', '\0', '\0'};
constexpr uint32_t kVersion = 2;        // authenticated (HMAC-SHA256 tag)
constexpr uint32_t kLegacyVersion = 1;  // FNV-1a checksum only
constexpr size_t kTag = base::kFileTagBytes;
constexpr size_t kKeyId = base::kFileKeyIdBytes;

// The body after the header: the layout, the round and the parts.
Checkpoint decode_body(base::FileReader& r, const CheckpointLayout& expect) {
  Checkpoint c;
  c.num_servers = static_cast<int>(r.get<uint32_t>("the server count"));
  c.rank = static_cast<int>(r.get<uint32_t>("the server rank"));
  c.num_workers = static_cast<int>(r.get<uint32_t>("the worker count"));
  c.round = r.get<int64_t>("the round");
  if (c.num_servers != expect.num_servers || c.rank != expect.rank ||
      c.num_workers != expect.num_workers)
    r.fail(fmt::format(
        "belongs to another job layout (server {} of {} servers, {} workers; this "
        "job needs server {} of {} servers, {} workers)",
        c.rank, c.num_servers, c.num_workers, expect.rank, expect.num_servers, expect.num_workers));
  if (c.round < 0) r.fail(fmt::format("negative round {}", c.round));
  auto nparts = r.get<uint64_t>("the part count");
  for (uint64_t i = 0; i < nparts; ++i) {
    CheckpointPart p;
    p.key = r.get<uint64_t>("a key id");
    p.begin = r.get<int64_t>("a part begin");
    p.home = r.get<int32_t>("a part's home");
    if (p.begin < 0) r.fail(fmt::format("part {}: negative begin {}", i, p.begin));
    auto len = r.get<uint32_t>("a name length");
    p.name.assign(r.take(len, "a key name"), len);
    auto dtype = r.get<uint8_t>("a dtype");
    if (!is_valid_dtype(dtype)) r.fail(fmt::format("key {}: bad dtype {}", p.name, dtype));
    auto ndim = r.get<uint8_t>("a dimension count");
    if (ndim > Shape::kMaxDims) r.fail(fmt::format("key {}: {} dimensions", p.name, ndim));
    std::vector<int64_t> dims(ndim);
    for (auto& d : dims)
      d = r.get<int64_t>("a dimension");
    int64_t numel = 0;
    uint64_t want = 0;
    if (!Shape::checked_numel(dims, &numel) ||
        !checked_mul(static_cast<uint64_t>(numel),
                     static_cast<uint64_t>(dtype_size(static_cast<DType>(dtype))), &want))
      r.fail(fmt::format("key {}: bad shape", p.name));
    auto nbytes = r.get<uint64_t>("a value size");
    if (nbytes != want)
      r.fail(fmt::format("key {}: {} value bytes for {} elements", p.name, nbytes, numel));
    const char* data = r.take(nbytes, "a value");
    auto a =
        std::make_shared<Array>(Shape(std::span<const int64_t>(dims)), static_cast<DType>(dtype));
    if (nbytes) std::memcpy(a->data(), data, nbytes);
    p.value = a->view();
    p.owner = a;
    auto slen = r.get<uint64_t>("an optimizer state length");
    p.optimizer_states.assign(r.take(slen, "optimizer states"), slen);
    c.parts.push_back(std::move(p));
  }
  if (r.left() != 0) r.fail(fmt::format("{} unexpected bytes after the parts", r.left()));
  return c;
}

}  // namespace

std::string encode_checkpoint(const Checkpoint& c, const base::FileKey& key) {
  if (key.key.empty() || key.id.size() != kKeyId)
    throw InvalidArgument("encode_checkpoint: no checkpoint key");
  std::string out(kMagic, sizeof kMagic);
  put_le(out, kVersion);
  out += key.id;
  put_le(out, static_cast<uint32_t>(c.num_servers));
  put_le(out, static_cast<uint32_t>(c.rank));
  put_le(out, static_cast<uint32_t>(c.num_workers));
  put_le(out, c.round);
  put_le(out, static_cast<uint64_t>(c.parts.size()));
  for (const CheckpointPart& p : c.parts) {
    put_le(out, p.key);
    put_le(out, p.begin);
    put_le(out, static_cast<int32_t>(p.home));
    put_le(out, static_cast<uint32_t>(p.name.size()));
    out += p.name;
    put_le(out, static_cast<uint8_t>(p.value.dtype));
    put_le(out, static_cast<uint8_t>(p.value.shape.ndim()));
    for (int64_t d : p.value.shape.dims())
      put_le(out, d);
    put_le(out, static_cast<uint64_t>(p.value.nbytes()));
    out.append(static_cast<const char*>(p.value.data), p.value.nbytes());
    put_le(out, static_cast<uint64_t>(p.optimizer_states.size()));
    out += p.optimizer_states;
  }
  out += key.tag(out);
  return out;
}

Checkpoint decode_checkpoint(std::string_view bytes, std::string_view source,
                             const CheckpointLayout& expect, const base::FileKey& key) {
  base::FileReader head(bytes, "checkpoint", source, "the file is torn or not a checkpoint");
  if (std::memcmp(head.take(sizeof kMagic, "the magic number"), kMagic, sizeof kMagic) != 0)
    head.fail("bad magic number: not a pushpull checkpoint");
  auto version = head.get<uint32_t>("the version");
  if (version == kLegacyVersion) {
    // Unauthenticated: anyone who can write the directory could have made it.
    if (!key.allow_unauthenticated)
      head.fail(
          "format version 1 is not authenticated (it carries no tag of your checkpoint key, so "
          "it may have been written by anyone), and this build reads it only with "
          "PUSHPULL_ALLOW_INSECURE=1: if you trust the file, resume once with "
          "PUSHPULL_ALLOW_INSECURE=1 and --checkpoint-every N; the resumed job writes "
          "authenticated (version 2) checkpoints");
    if (bytes.size() < sizeof kMagic + 4 + 8) head.take(8, "the checksum");
    uint64_t stored;
    std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
    if (base::fnv1a(bytes.data(), bytes.size() - 8) != stored)
      head.fail("checksum mismatch: the file is torn or corrupt");
    base::FileReader r(bytes.substr(0, bytes.size() - 8), "checkpoint", source,
                       "the file is torn or not a checkpoint");
    r.take(sizeof kMagic + 4, "the header");
    PP_WARN(
        "checkpoint '{}': format version 1 is not authenticated; read because "
        "PUSHPULL_ALLOW_INSECURE=1",
        source);
    return decode_body(r, expect);
  }
  if (version != kVersion)
    head.fail(fmt::format("format version {} is not supported (this build reads version {})",
                          version, kVersion));
  const char* id = head.take(kKeyId, "the key id");
  head.take(kTag, "the authentication tag");  // a file this short is torn
  const std::string_view body = bytes.substr(0, bytes.size() - kTag);
  if (!key.verify(body, bytes.substr(bytes.size() - kTag))) {
    if (std::string_view(id, kKeyId) != key.id)
      head.fail(fmt::format(
          "not authenticated: written by another user or with another secret (its key id is "
          "{}; this process's {}); refused; {}",
          base::FileKey{{}, std::string(id, kKeyId), {}, {}, false}.id_hex(), key.describe(),
          key.mismatch_hint()));
    head.fail(
        "authentication tag mismatch: the file is torn, corrupt or was modified after it was "
        "written; refused");
  }
  // Only a holder of the key could write this (one encoding per content).
  if (std::string_view(id, kKeyId) != key.id)
    head.fail("its key id does not match the key that tagged it");
  base::FileReader r(body, "checkpoint", source, "the file is torn or not a checkpoint");
  r.take(sizeof kMagic + 4 + kKeyId, "the header");
  return decode_body(r, expect);
}

std::string checkpoint_path(const std::string& dir, int64_t round, int rank) {
  return fmt::format("{}/round-{:010d}/server-{}.ppckpt", dir, round, rank);
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  // Through the one private-file helper (base/private_file.h): round
  // directories 0700, the file 0600 via an O_EXCL temporary, fsync'd and
  // renamed over `path`; never through a symlink or over another user's file.
  std::filesystem::path p(path);
  if (p.has_parent_path()) base::make_private_dirs(p.parent_path().string(), "checkpoint");
  base::write_private_file(path, bytes, "checkpoint", /*durable=*/true);
}

Checkpoint read_checkpoint(const std::string& path, const CheckpointLayout& expect,
                           const base::FileKey& key) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw IoError(fmt::format("checkpoint '{}': cannot open: {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string bytes = std::move(ss).str();
  return decode_checkpoint(bytes, path, expect, key);
}

namespace {

// The round of a directory named round-<10 digits>, else nullopt.
std::optional<int64_t> round_of(const std::string& name) {
  if (name.rfind("round-", 0) != 0 || name.size() != 16) return std::nullopt;
  int64_t round = 0;
  for (char ch : name.substr(6)) {
    if (ch < '0' || ch > '9') return std::nullopt;
    round = round * 10 + (ch - '0');
  }
  return round;
}

}  // namespace

std::vector<std::string> set_aside_rounds_after(const std::string& dir, int64_t resumed) {
  std::vector<std::string> moved;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    auto round = round_of(name);
    if (!round || *round <= resumed) continue;
    const auto to = entry.path().parent_path() / fmt::format("{}.abandoned-{}", name, resumed);
    std::filesystem::rename(entry.path(), to, ec);
    if (ec)
      throw IoError(fmt::format("cannot set aside checkpoint round '{}': {}", entry.path().string(),
                                ec.message()));
    moved.push_back(to.string());
  }
  if (ec) throw IoError(fmt::format("checkpoint directory '{}': {}", dir, ec.message()));
  return moved;
}

std::optional<int64_t> last_complete_checkpoint(const std::string& dir, int num_servers) {
  std::optional<int64_t> best;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    auto found = round_of(entry.path().filename().string());
    if (!found || (best && *found <= *best)) continue;
    const int64_t round = *found;
    bool complete = true;
    for (int s = 0; s < num_servers && complete; ++s)
      complete = std::filesystem::exists(checkpoint_path(dir, round, s), ec);
    if (complete) best = round;
  }
  if (ec && !std::filesystem::exists(dir))
    throw IoError(fmt::format("checkpoint directory '{}' does not exist", dir));
  return best;
}

}  // namespace pushpull::ps
