// SPDX-License-Identifier: Apache-2.0
// Optimizer state files. Layout (little-endian, see docs/kvstore.md):
//   magic "PPOPTST\0" | u32 version | u32 len, optimizer name | u64 keys
//   per key: u8 kind (0 int, 1 string) | i64 key or u32 len, bytes
//            | i64 update count | u32 arrays
//            per array: u8 dtype | u8 ndim | i64 dims[ndim] | u64 bytes | data
//   u64 FNV-1a hash of every byte before it
#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "base/file_codec.h"
#include "base/private_file.h"
#include "pushpull/error.h"
#include "pushpull/optimizer.h"

namespace pushpull {
namespace {

using base::put_le;

constexpr char kMagic[8] = {'P', 'P', 'O', 'P', 'T', 'S', 'T', '\0'};
constexpr uint32_t kVersion = 1;

}  // namespace

std::string Optimizer::save_states() const {
  return save_some(nullptr);
}

std::string Optimizer::save_key_states(const Key& key) const {
  return save_some(&key);
}

void Optimizer::load_states(std::string_view bytes, std::string_view source) {
  load_some(bytes, source, false);
}

void Optimizer::merge_states(std::string_view bytes, std::string_view source) {
  load_some(bytes, source, true);
}

std::string Optimizer::save_some(const Key* only) const {
  std::lock_guard lock(mu_);
  std::string out(kMagic, sizeof kMagic);
  put_le(out, kVersion);
  put_le(out, static_cast<uint32_t>(spec_.name.size()));
  out += spec_.name;
  uint64_t n = only ? static_cast<uint64_t>(states_.count(*only)) : states_.size();
  put_le(out, n);
  for (const auto& [key, st] : states_) {
    if (only && !(key == *only)) continue;
    put_le(out, static_cast<uint8_t>(key.is_int() ? 0 : 1));
    if (key.is_int()) {
      put_le(out, key.as_int());
    } else {
      put_le(out, static_cast<uint32_t>(key.as_string().size()));
      out += key.as_string();
    }
    put_le(out, st->count);
    put_le(out, static_cast<uint32_t>(st->arrays.size()));
    for (const Array& a : st->arrays) {
      put_le(out, static_cast<uint8_t>(a.dtype()));
      put_le(out, static_cast<uint8_t>(a.shape().ndim()));
      for (int64_t d : a.shape().dims())
        put_le(out, d);
      put_le(out, static_cast<uint64_t>(a.nbytes()));
      out.append(static_cast<const char*>(a.data()), a.nbytes());
    }
  }
  put_le(out, base::fnv1a(out.data(), out.size()));
  return out;
}

void Optimizer::load_some(std::string_view bytes, std::string_view source, bool merge) {
  base::FileReader r(bytes, "optimizer states", source,
                     "the file is incomplete or not an optimizer state file");
  if (std::memcmp(r.take(sizeof kMagic, "the magic number"), kMagic, sizeof kMagic) != 0)
    r.corrupt("bad magic number: not a pushpull optimizer state file");
  auto version = r.get<uint32_t>("the version");
  if (version != kVersion)
    r.corrupt(fmt::format("format version {} is not supported (this build reads version {})",
                          version, kVersion));
  if (r.left() < 8) r.take(8, "the checksum");
  uint64_t stored_hash;
  std::memcpy(&stored_hash, bytes.data() + bytes.size() - 8, 8);
  if (base::fnv1a(bytes.data(), bytes.size() - 8) != stored_hash)
    throw IoError(fmt::format(
        "optimizer states '{}': checksum mismatch: the file is truncated or corrupt", source));
  base::FileReader body(bytes.substr(0, bytes.size() - 8), "optimizer states", source,
                        "the file is incomplete or not an optimizer state file");
  body.take(sizeof kMagic + 4, "the header");

  auto name_len = body.get<uint32_t>("the name length");
  std::string name(body.take(name_len, "the optimizer name"), name_len);
  if (name != spec_.name)
    throw InvalidArgument(
        fmt::format("optimizer states '{}' belong to optimizer '{}', not '{}'; set_optimizer "
                    "with the same optimizer before loading",
                    source, name, spec_.name));
  auto nkeys = body.get<uint64_t>("the key count");
  std::map<Key, std::unique_ptr<KeyState>> loaded;
  for (uint64_t k = 0; k < nkeys; ++k) {
    auto kind = body.get<uint8_t>("a key kind");
    Key key;
    if (kind == 0) {
      key = Key(body.get<int64_t>("an int key"));
    } else if (kind == 1) {
      auto len = body.get<uint32_t>("a key length");
      key = Key(std::string(body.take(len, "a string key"), len));
    } else {
      body.corrupt(fmt::format("key kind {} is neither 0 (int) nor 1 (string)", kind));
    }
    auto st = std::make_unique<KeyState>();
    st->count = body.get<int64_t>("an update count");
    if (st->count < 0) body.corrupt("negative update count");
    auto narrays = body.get<uint32_t>("an array count");
    if (narrays > 8) body.corrupt(fmt::format("{} state arrays for one key (at most 8)", narrays));
    for (uint32_t i = 0; i < narrays; ++i) {
      auto dt = body.get<uint8_t>("a dtype");
      if (!is_valid_dtype(dt)) body.corrupt(fmt::format("invalid dtype {}", dt));
      auto ndim = body.get<uint8_t>("a rank");
      if (ndim > Shape::kMaxDims) body.corrupt(fmt::format("rank {} is too large", ndim));
      int64_t dims[Shape::kMaxDims];
      for (int d = 0; d < ndim; ++d) {
        dims[d] = body.get<int64_t>("a dimension");
        if (dims[d] < 0 || static_cast<uint64_t>(dims[d]) > body.left())
          body.corrupt(fmt::format("dimension {} is out of range", dims[d]));
      }
      Shape shape(std::span<const int64_t>(dims, ndim));
      auto nbytes = body.get<uint64_t>("an array size");
      // Checked against the bytes left before anything is allocated.
      if (nbytes > body.left()) body.take(nbytes, "array data");
      if (nbytes != static_cast<uint64_t>(shape.numel()) * dtype_size(static_cast<DType>(dt)))
        body.corrupt(fmt::format("array of {} bytes does not match its shape {}", nbytes,
                                 shape.to_string()));
      Array a(shape, static_cast<DType>(dt));
      std::memcpy(a.data(), body.take(nbytes, "array data"), nbytes);
      st->arrays.push_back(std::move(a));
    }
    if (!loaded.emplace(key, std::move(st)).second)
      body.corrupt(fmt::format("key {} appears twice", key.to_string()));
  }
  if (body.left() != 0) body.corrupt(fmt::format("{} unexpected bytes at the end", body.left()));
  std::lock_guard lock(mu_);
  if (!merge) {
    states_ = std::move(loaded);
    return;
  }
  for (auto& [key, st] : loaded)
    states_[key] = std::move(st);
}

void Optimizer::save_states_to_file(const std::string& path) const {
  // An O_EXCL temporary renamed over `path` (base/private_file.h): 0600,
  // never through a symlink, never over another user's file.
  base::write_private_file(path, save_states(), "optimizer states");
}

void Optimizer::load_states_from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw IoError(fmt::format("cannot open optimizer states '{}': {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw IoError(fmt::format("reading optimizer states '{}' failed", path));
  load_states(ss.str(), path);
}

}  // namespace pushpull
