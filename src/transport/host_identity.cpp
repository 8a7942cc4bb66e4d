// SPDX-License-Identifier: Apache-2.0
#include "transport/host_identity.h"

#include <openssl/crypto.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "transport/hello.h"
#include "transport/wire.h"

namespace pushpull::transport {
namespace {

constexpr uint8_t kRecordVersion = 2;  // 1: the collectives' own record (probe, content, token)
constexpr size_t kMaxKeyBytes = 255;   // what a u8 length can say

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

std::string host_identity() {
  char host[65] = {};
  ::gethostname(host, sizeof host - 1);
  // The PID namespace matters to the collectives' liveness checks (they
  // look at peers' pids). The mount namespace is left out on purpose: `ip
  // netns exec` makes one per process, and what it would guard (a private
  // /dev/shm) shows in the segment directory's inode and in the proofs.
  return fmt::format("{:.36}|{}|net {}|pid {}", first_line("/proc/sys/kernel/random/boot_id"), host,
                     inode_of("/proc/self/ns/net"), inode_of("/proc/self/ns/pid"));
}

std::string host_key(const std::string& dir) {
  return fmt::format("{}|dir {}|uid {}", host_identity(), inode_of(dir), ::geteuid())
      .substr(0, kMaxKeyBytes);
}

std::string inode_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "?";
  return fmt::format("{}:{}", static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
}

std::vector<std::byte> encode(const HostRecord& r) {
  Writer w;
  w.u<uint8_t>(kRecordVersion).bytes(r.file).bytes(r.content).str<uint8_t>(r.key);
  std::vector<std::byte> out = w.take();
  out.resize(kHostRecordBytes);  // zero pad: every record is as wide
  return out;
}

Status decode(std::span<const std::byte> in, HostRecord* out) {
  Reader r(in);
  const auto version = r.u<uint8_t>();
  r.bytes(out->file);
  r.bytes(out->content);
  out->key = r.str<uint8_t>(kMaxKeyBytes);
  const auto pad = r.rest();
  if (in.size() != kHostRecordBytes || !r.ok() || version != kRecordVersion ||
      std::any_of(pad.begin(), pad.end(), [](std::byte b) { return b != std::byte{0}; }))
    return {ErrorCode::kProtocolError,
            fmt::format("malformed host record ({} bytes, version {})", in.size(), version)};
  return {};
}

HostRecord prove(const std::string& dir, const ShmFile& file, const ProofForm& form) {
  HostRecord r{.key = host_key(dir), .file = file.id()};
  const Nonce n = random_nonce();
  std::memcpy(r.content.data(), n.data(), r.content.size());
  std::memcpy(file.data() + form.content_at, r.content.data(), r.content.size());
  return r;
}

Status verify(const std::string& dir, const HostRecord& peer, const ProofForm& form, ShmMapping map,
              std::unique_ptr<ShmFile>* out) {
  // Another network namespace of this kernel could open our files, but it
  // stands for another machine: its bytes must cross the links between.
  if (peer.key != host_key(dir))
    return {ErrorCode::kIoError,
            "another host (its kernel, host name, network namespace, user or segment directory "
            "differs)"};
  // ShmFile::open refuses a missing file, another user's or a shared one, a
  // symlink, a FIFO and a size out of range.
  const std::string name = std::string(form.kind.prefix) + to_hex(peer.file.data(), 16);
  std::unique_ptr<ShmFile> f;
  if (Status st = ShmFile::open(dir, name, form.kind, form.min_bytes, form.max_bytes, map, &f); !st)
    return st;
  if (CRYPTO_memcmp(f->data() + form.content_at, peer.content.data(), peer.content.size()) != 0)
    return {ErrorCode::kProtocolError,
            fmt::format("{}/{} does not hold what its record says: no proof", dir, name)};
  *out = std::move(f);
  return {};
}

}  // namespace pushpull::transport
