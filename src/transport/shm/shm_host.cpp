// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/shm_host.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "pushpull/error.h"
#include "transport/hello.h"
#include "transport/host_identity.h"

namespace pushpull::transport {
namespace {

constexpr uint8_t kRecordVersion = 1;
constexpr size_t kKeyBytes = 192;  // NUL-terminated within
constexpr size_t kProbeAt = kKeyBytes, kContentAt = kProbeAt + 16, kTokenAt = kContentAt + 16,
                 kVersionAt = kTokenAt + 16;
static_assert(kVersionAt < kHostRecordBytes);

constexpr transport::ShmKind kProbeKind{"pushpull-probe-", 32};

Bytes16 random16() {
  transport::Nonce n = transport::random_nonce();
  Bytes16 b{};
  std::memcpy(b.data(), n.data(), b.size());
  return b;
}

}  // namespace

std::vector<uint8_t> encode(const HostRecord& r) {
  std::vector<uint8_t> out(kHostRecordBytes, 0);
  const size_t n = std::min(r.key.size(), kKeyBytes - 1);
  std::memcpy(out.data(), r.key.data(), n);
  std::memcpy(out.data() + kProbeAt, r.probe.data(), 16);
  std::memcpy(out.data() + kContentAt, r.content.data(), 16);
  std::memcpy(out.data() + kTokenAt, r.token.data(), 16);
  out[kVersionAt] = kRecordVersion;
  return out;
}

HostRecord decode_host_record(const uint8_t* data, size_t bytes) {
  if (bytes != kHostRecordBytes || data[kVersionAt] != kRecordVersion)
    throw ProtocolError(fmt::format("collective: a host record of {} bytes, version {}", bytes,
                                    bytes > kVersionAt ? data[kVersionAt] : 0));
  const void* nul = std::memchr(data, 0, kKeyBytes);
  if (!nul) throw ProtocolError("collective: a host record's key is not terminated");
  HostRecord r;
  r.key.assign(reinterpret_cast<const char*>(data), static_cast<const uint8_t*>(nul) - data);
  std::memcpy(r.probe.data(), data + kProbeAt, 16);
  std::memcpy(r.content.data(), data + kContentAt, 16);
  std::memcpy(r.token.data(), data + kTokenAt, 16);
  return r;
}

HostProbe::HostProbe(const std::string& dir) : dir_(dir) {
  record_.key = host_key(dir);
  record_.content = random16();
  record_.token = random16();
  if (Status st = transport::ShmFile::create(dir, kProbeKind, sizeof record_.content,
                                             transport::ShmMapping{.writable = true}, &probe_);
      !st)
    throw IoError(
        fmt::format("collective shm: cannot create a probe in {}: {}", dir, st.message()));
  std::memcpy(record_.probe.data(), probe_->id().data(), record_.probe.size());
  std::memcpy(probe_->data(), record_.content.data(), record_.content.size());
}

HostProbe::~HostProbe() = default;

bool HostProbe::reserve(size_t bytes) {
  // A file of its own, held until remove(): the probe keeps the exact size
  // its peers check.
  return probe_ && transport::ShmFile::create(dir_, kProbeKind, bytes,
                                              transport::ShmMapping{.writable = true}, &reserved_)
                       .is_ok();
}

void HostProbe::remove() {
  probe_.reset();
  reserved_.reset();
}

bool HostProbe::sees(const HostRecord& peer) const {
  const std::string name = std::string(kProbeKind.prefix) + to_hex(peer.probe.data(), 16);
  std::unique_ptr<transport::ShmFile> f;
  return transport::ShmFile::open(dir_, name, kProbeKind, 16, 16, transport::ShmMapping{}, &f)
             .is_ok() &&
         std::memcmp(f->data(), peer.content.data(), 16) == 0;
}

int sweep_stale_files(const std::string& dir) {
  return transport::ShmFile::sweep_stale(dir, kProbeKind, transport::kShmStaleAfter) +
         transport::ShmFile::sweep_stale(dir, transport::ShmKind{"pushpull-coll-", 32},
                                         transport::kShmStaleAfter);
}

std::vector<int> same_key(const std::vector<HostRecord>& records, int rank) {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(records.size()); ++r)
    if (records[static_cast<size_t>(r)].key == records[static_cast<size_t>(rank)].key)
      out.push_back(r);
  return out;
}

std::vector<int> shm_group(const std::vector<HostRecord>& records,
                           const std::vector<std::vector<uint8_t>>& proof, int rank) {
  std::vector<int> g = same_key(records, rank);
  if (g.size() < 2) return {};
  for (int i : g)
    for (int j : g) {
      const auto& row = proof.at(static_cast<size_t>(i));
      if (static_cast<size_t>(j) >= row.size() || !row[static_cast<size_t>(j)]) return {};
    }
  return g;
}

}  // namespace pushpull::transport
