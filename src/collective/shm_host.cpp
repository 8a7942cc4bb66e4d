// SPDX-License-Identifier: Apache-2.0
#include "collective/shm_host.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "net/hello.h"
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

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string inode_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "?";
  return fmt::format("{}:{}", static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
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
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  // The boot id tells kernels apart (host names repeat across containers);
  // the network namespace keeps network-namespace "hosts" apart; the PID
  // namespace matters because liveness checks peers' pids. The mount
  // namespace is left out on purpose: `ip netns exec` makes one per process,
  // and what it would guard (a private /dev/shm) shows in the directory's
  // device and inode, and in the probe.
  return fmt::format(
      "{}|{}|net {}|pid {}|dir {}|uid {}", first_line("/proc/sys/kernel/random/boot_id"), host,
      inode_of("/proc/self/ns/net"), inode_of("/proc/self/ns/pid"), inode_of(dir), ::geteuid());
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
