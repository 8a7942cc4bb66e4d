// SPDX-License-Identifier: Apache-2.0
#include "transport/host_identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>

#include <fmt/format.h>

namespace pushpull::transport {
namespace {

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
  return fmt::format("{}|dir {}|uid {}", host_identity(), inode_of(dir), ::geteuid());
}

std::string inode_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "?";
  return fmt::format("{}:{}", static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
}

}  // namespace pushpull::transport
