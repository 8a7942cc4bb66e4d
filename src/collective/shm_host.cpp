// SPDX-License-Identifier: Apache-2.0
#include "collective/shm_host.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "net/hello.h"
#include "net/host_identity.h"
#include "pushpull/error.h"

namespace pushpull::collective {
namespace {

constexpr uint8_t kRecordVersion = 1;
constexpr size_t kKeyBytes = 192;  // NUL-terminated within
constexpr size_t kProbeAt = kKeyBytes, kContentAt = kProbeAt + 16, kTokenAt = kContentAt + 16,
                 kVersionAt = kTokenAt + 16;
static_assert(kVersionAt < kHostRecordBytes);

Bytes16 random16() {
  net::Nonce n = net::random_nonce();
  Bytes16 b{};
  std::memcpy(b.data(), n.data(), b.size());
  return b;
}

std::string hex(const Bytes16& b) {
  std::string s;
  for (uint8_t c : b)
    s += fmt::format("{:02x}", c);
  return s;
}

std::string probe_path(const std::string& dir, const Bytes16& name) {
  return fmt::format("{}/pushpull-probe-{}", dir, hex(name));
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

std::string host_key(const std::string& dir) {
  // The directory's device and inode tell a private /dev/shm apart.
  return fmt::format("{}|dir {}|uid {}", net::host_identity(), net::inode_of(dir), ::geteuid());
}

HostProbe::HostProbe(const std::string& dir) : dir_(dir) {
  record_.key = host_key(dir);
  record_.probe = random16();
  record_.content = random16();
  record_.token = random16();
  path_ = probe_path(dir, record_.probe);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd_ < 0) {
    std::string why = std::strerror(errno);
    path_.clear();
    throw IoError(fmt::format("collective shm: cannot create a probe in {}: {}", dir, why));
  }
  if (::write(fd_, record_.content.data(), 16) != 16) {
    std::string why = std::strerror(errno);
    remove();
    throw IoError(fmt::format("collective shm: cannot write a probe in {}: {}", dir, why));
  }
}

HostProbe::~HostProbe() {
  remove();
}

bool HostProbe::reserve(size_t bytes) {
  return fd_ >= 0 && ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes)) == 0;
}

void HostProbe::remove() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!path_.empty()) ::unlink(path_.c_str());
  path_.clear();
}

bool HostProbe::sees(const HostRecord& peer) const {
  int fd = ::open(probe_path(dir_, peer.probe).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  struct stat st {};
  Bytes16 got{};
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
                  (st.st_mode & 077) == 0 && ::pread(fd, got.data(), 16, 0) == 16 &&
                  got == peer.content;
  ::close(fd);
  return ok;
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

}  // namespace pushpull::collective
