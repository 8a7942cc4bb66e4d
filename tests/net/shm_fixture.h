// SPDX-License-Identifier: Apache-2.0
// Helpers of the shared-memory tests of the MessageTransport (shm_test.cpp,
// shm_peers_test.cpp, shm_segment_test.cpp): a config with a small ring,
// payload patterns and a private segment directory. No shared state: each
// call returns its own value, and a TempShmDir owns (and removes) its
// directory.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <string>
#include <vector>

#include "fixture.h"

namespace pushpull::test {

// A small ring, so big payloads wrap it many times and wait for releases.
inline TransportConfig shm_config(Role role, int rank, bool on = true) {
  TransportConfig c = test::config(role, rank);
  c.shared_memory = on;
  c.shm_ring_bytes = 64 << 10;
  return c;
}

inline std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 131 + seed * 7) & 0xff);
  return v;
}

// A private directory on tmpfs, removed at the end.
struct TempShmDir {
  TempShmDir() {
    char t[] = "/dev/shm/pushpull-test-XXXXXX";
    EXPECT_NE(mkdtemp(t), nullptr);
    path = t;
  }
  ~TempShmDir() { ::rmdir(path.c_str()); }
  std::string path;
};
}  // namespace pushpull::test
