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

namespace pushpull::ps {
namespace {

using base::put_le;

constexpr char kMagic[8] = {'P', 'P', 'C', 'K', 'P', 'T', '\0', '\0'};
constexpr uint32_t kVersion = 1;

}  // namespace

std::string encode_checkpoint(const Checkpoint& c) {
  std::string out(kMagic, sizeof kMagic);
  put_le(out, kVersion);
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
  put_le(out, base::fnv1a(out.data(), out.size()));
  return out;
}

Checkpoint decode_checkpoint(std::string_view bytes, std::string_view source,
                             const CheckpointLayout& expect) {
  base::FileReader head(bytes, "checkpoint", source, "the file is torn or not a checkpoint");
  if (std::memcmp(head.take(sizeof kMagic, "the magic number"), kMagic, sizeof kMagic) != 0)
    head.fail("bad magic number: not a pushpull checkpoint");
  auto version = head.get<uint32_t>("the version");
  if (version != kVersion)
    head.fail(fmt::format("format version {} is not supported (this build reads version {})",
                          version, kVersion));
  if (bytes.size() < sizeof kMagic + 4 + 8) head.take(8, "the checksum");
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  if (base::fnv1a(bytes.data(), bytes.size() - 8) != stored)
    head.fail("checksum mismatch: the file is torn or corrupt");
  base::FileReader r(bytes.substr(0, bytes.size() - 8), "checkpoint", source,
                     "the file is torn or not a checkpoint");
  r.take(sizeof kMagic + 4, "the header");
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
  return c;
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

Checkpoint read_checkpoint(const std::string& path, const CheckpointLayout& expect) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw IoError(fmt::format("checkpoint '{}': cannot open: {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string bytes = std::move(ss).str();
  return decode_checkpoint(bytes, path, expect);
}

std::optional<int64_t> last_complete_checkpoint(const std::string& dir, int num_servers) {
  std::optional<int64_t> best;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("round-", 0) != 0 || name.size() != 16) continue;
    int64_t round = 0;
    bool digits = true;
    for (char ch : name.substr(6)) {
      if (ch < '0' || ch > '9') digits = false;
      round = round * 10 + (ch - '0');
    }
    if (!digits || (best && round <= *best)) continue;
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
