// SPDX-License-Identifier: Apache-2.0
// The one SPSC ring (transport/shm/shm_ring.h): copies across the wrap, free and used
// space when empty and full, positions past 4 GiB, and a producer and a
// consumer thread streaming through a small ring with the positions in
// ShmRingCtl (acquire/release), every byte checked.
#include <gtest/gtest.h>

#include <numeric>
#include <thread>
#include <vector>

#include "transport/shm/shm_ring.h"

namespace pushpull::transport {
namespace {

std::vector<std::byte> pattern(size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return v;
}

TEST(ShmRing, CopiesAcrossTheWrap) {
  std::vector<std::byte> mem(64 + 2, std::byte{0xee});  // a guard byte on each side
  const ShmRing r(mem.data() + 1, 64);
  const auto in = pattern(40, 3);
  const uint64_t pos = (uint64_t{5} << 32) + 50;  // far into the stream, 14 before the end
  r.copy_in(pos, in.data(), in.size());
  // 14 bytes at the end of the ring, 26 at its start.
  EXPECT_EQ(std::memcmp(mem.data() + 1 + 50, in.data(), 14), 0);
  EXPECT_EQ(std::memcmp(mem.data() + 1, in.data() + 14, 26), 0);
  EXPECT_EQ(mem.front(), std::byte{0xee});
  EXPECT_EQ(mem.back(), std::byte{0xee});
  std::vector<std::byte> out(40);
  r.copy_out(pos, out.data(), out.size());
  EXPECT_EQ(out, in);
  // Part of it, from inside the wrapped piece; a null destination skips.
  r.copy_out(pos + 20, out.data(), 10);
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 10, in.begin() + 20));
  r.copy_out(pos, nullptr, 40);
  // The whole ring in one copy, starting anywhere.
  const auto all = pattern(64, 9);
  r.copy_in(pos + 7, all.data(), 64);
  std::vector<std::byte> back(64);
  r.copy_out(pos + 7, back.data(), 64);
  EXPECT_EQ(back, all);
}

TEST(ShmRing, FreeAndUsedWhenEmptyPartlyFullAndFull) {
  std::vector<std::byte> mem(4096);
  const ShmRing r(mem.data(), mem.size());
  const uint64_t tail = uint64_t{1} << 40;
  EXPECT_EQ(r.free(tail, tail), 4096u);  // empty
  EXPECT_EQ(ShmRing::used(tail, tail), 0u);
  EXPECT_EQ(r.free(tail + 1000, tail), 3096u);
  EXPECT_EQ(ShmRing::used(tail + 1000, tail), 1000u);
  EXPECT_EQ(r.free(tail + 4096, tail), 0u);  // full
  EXPECT_EQ(ShmRing::used(tail + 4096, tail), 4096u);
}

// A producer and a consumer thread, 1 MiB through a 4 KiB ring in pieces
// of odd sizes (every one wraps at another place), the positions published
// through ShmRingCtl as the collectives' rings do.
TEST(ShmRing, AProducerAndAConsumerStreamEveryByteInOrder) {
  std::vector<std::byte> mem(4096);
  const ShmRing r(mem.data(), mem.size());
  ShmRingCtl ctl{};
  const auto in = pattern(1 << 20, 5);
  std::vector<std::byte> out(in.size());
  std::thread producer([&] {
    uint64_t head = 0;
    size_t piece = 1;
    while (head < in.size()) {
      const uint64_t room = r.free(head, ctl.tail.load(std::memory_order_acquire));
      const size_t n = std::min<uint64_t>({room, piece, in.size() - head});
      if (n == 0) {
        std::this_thread::yield();
        continue;
      }
      r.copy_in(head, in.data() + head, n);
      head += n;
      ctl.head.store(head, std::memory_order_release);
      piece = piece * 7 % 1009 + 1;
    }
  });
  uint64_t tail = 0;
  uint64_t max_used = 0;
  while (tail < out.size()) {
    const uint64_t head = ctl.head.load(std::memory_order_acquire);
    const uint64_t n = ShmRing::used(head, tail);
    max_used = std::max(max_used, n);
    if (n == 0) {
      std::this_thread::yield();
      continue;
    }
    r.copy_out(tail, out.data() + tail, static_cast<size_t>(n));
    tail += n;
    ctl.tail.store(tail, std::memory_order_release);
  }
  producer.join();
  EXPECT_LE(max_used, r.size()) << "the producer overran the consumer";
  EXPECT_TRUE(out == in) << "bytes lost, reordered or torn";
}

}  // namespace
}  // namespace pushpull::transport
