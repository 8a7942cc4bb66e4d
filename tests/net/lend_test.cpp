// SPDX-License-Identifier: Apache-2.0
// Lending buffers to a same-host peer (transport/shm/lend.h): the block is found from
// any address inside it, a reader copies the right bytes (also from another
// process), a pinned range outlives its owner, and a reference that names the
// wrong token, size, descriptor or range, or a look-alike that is not sealed,
// is refused instead of read. The lending BufferPool hands out slab pieces
// that its find_lent() knows (and no other pool does).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "transport/buffer_pool.h"
#include "transport/shm/lend.h"

namespace pushpull::transport {
namespace {

std::unique_ptr<LendBlock> block_of(size_t bytes) {
  std::unique_ptr<LendBlock> b;
  Status st = LendBlock::create(bytes, &b);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(st.is_ok(), b != nullptr);
  return b;
}

void fill(LendBlock& b) {
  auto* p = reinterpret_cast<uint8_t*>(b.data());
  for (size_t i = 0; i < b.size(); ++i)
    p[i] = static_cast<uint8_t>(i * 7 + 3);
}

TEST(Lend, ABlockKnowsRangesInsideItOnly) {
  auto b = block_of(1 << 20);
  auto ref = b->ref(b->data() + 4096, 8192);
  ASSERT_TRUE(ref);
  EXPECT_EQ(ref->pid, static_cast<uint32_t>(::getpid()));
  EXPECT_EQ(ref->block_bytes, size_t{1} << 20);
  EXPECT_EQ(ref->offset, 4096u);
  EXPECT_EQ(ref->bytes, 8192u);
  EXPECT_TRUE(b->ref(b->data() + (1 << 20) - 10, 10));   // up to the end
  EXPECT_FALSE(b->ref(b->data() + (1 << 20) - 10, 11));  // runs past the end
  std::vector<std::byte> heap(4096);
  EXPECT_FALSE(b->ref(heap.data(), heap.size()));
}

TEST(Lend, AReaderCopiesTheRangeAndKeepsTheMapping) {
  auto b = block_of(1 << 20);
  fill(*b);
  auto ref = b->ref(b->data() + 100, 5000);
  ASSERT_TRUE(ref);
  LendReader reader;
  std::vector<std::byte> out(5000);
  ASSERT_TRUE(reader.copy(*ref, out.data()).is_ok());
  EXPECT_EQ(std::memcmp(out.data(), b->data() + 100, out.size()), 0);
  EXPECT_EQ(reader.mapped_bytes(), size_t{1} << 20);
  // The owner changes its block (it may, once the reader said it is done):
  // the next copy sees the new bytes through the same mapping.
  std::memset(b->data(), 0x5a, b->size());
  ASSERT_TRUE(reader.copy(*ref, out.data()).is_ok());
  EXPECT_EQ(out[0], std::byte{0x5a});
  EXPECT_EQ(reader.mapped_bytes(), size_t{1} << 20);
  reader.forget(ref->pid);
  EXPECT_EQ(reader.mapped_bytes(), 0u);
}

TEST(Lend, AWrongTokenSizeOrDescriptorIsRefused) {
  auto b = block_of(1 << 20);
  auto good = b->ref(b->data(), 64);
  ASSERT_TRUE(good);
  LendReader reader;
  std::vector<std::byte> out(64);
  LendRef wrong_token = *good;
  wrong_token.token[3] ^= std::byte{1};
  Status st = reader.copy(wrong_token, out.data());
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("not the block named"), std::string::npos) << st.message();
  LendRef wrong_size = *good;
  wrong_size.block_bytes *= 2;
  EXPECT_FALSE(reader.copy(wrong_size, out.data()).is_ok());
  LendRef not_memfd = *good;
  not_memfd.fd = STDIN_FILENO;  // whatever it is, not this block
  EXPECT_FALSE(reader.copy(not_memfd, out.data()).is_ok());
  int fifo[2];
  ASSERT_EQ(::pipe(fifo), 0);  // opening a pipe's read end through /proc would block
  LendRef pipe_end = *good;
  pipe_end.fd = fifo[0];
  EXPECT_FALSE(reader.copy(pipe_end, out.data()).is_ok());
  ::close(fifo[0]);
  ::close(fifo[1]);
  LendRef closed = *good;
  closed.fd = 100000;
  EXPECT_FALSE(reader.copy(closed, out.data()).is_ok());
  EXPECT_EQ(reader.mapped_bytes(), 0u);  // nothing refused stays mapped
}

TEST(Lend, AnUnsealedLookAlikeIsRefused) {
  // A memfd with a block's name and size but no seals: its owner could
  // shrink it under the reader's mapping, so it is not read.
  const std::string name = std::string(kLendNamePrefix) + std::string(32, '0');
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
  LendRef r{static_cast<uint32_t>(::getpid()), fd, {}, 1 << 20, 0, 64};
  LendReader reader;
  std::vector<std::byte> out(64);
  Status st = reader.copy(r, out.data());
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("not sealed"), std::string::npos) << st.message();
  ::close(fd);
}

TEST(Lend, AReusedDescriptorDropsTheOldMapping) {
  LendReader reader;
  std::vector<std::byte> out(16);
  auto first = block_of(1 << 20);
  fill(*first);
  auto ref1 = first->ref(first->data(), 16);
  ASSERT_TRUE(reader.copy(*ref1, out.data()).is_ok());
  first.reset();  // its descriptor number is free again
  auto second = block_of(1 << 20);
  std::memset(second->data(), 0x11, second->size());
  auto ref2 = second->ref(second->data(), 16);
  ASSERT_TRUE(ref2);
  ASSERT_TRUE(reader.copy(*ref2, out.data()).is_ok());
  EXPECT_EQ(out[0], std::byte{0x11});
  if (ref2->fd == ref1->fd) {
    EXPECT_EQ(reader.mapped_bytes(), size_t{1} << 20);
  }
}

TEST(Lend, AnotherProcessReadsTheBlock) {
  auto b = block_of(2 << 20);
  fill(*b);
  auto ref = b->ref(b->data() + 12345, 1 << 20);
  ASSERT_TRUE(ref);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A fresh reader in another process, as a backup server is.
    LendReader reader;
    std::vector<std::byte> out(1 << 20);
    if (!reader.copy(*ref, out.data()).is_ok()) ::_exit(2);
    ::_exit(std::memcmp(out.data(), b->data() + 12345, out.size()) == 0 ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: refused, 3: wrong bytes";
}

TEST(Lend, APinnedRangeOutlivesItsOwnerAndTheReadersMappings) {
  // The owner is a child process that lends a block, is pinned, and exits;
  // the range stays readable through the pin (a backup's value after its
  // primary died), after forget() and past the reader's mapping budget.
  int to_parent[2], to_child[2];
  ASSERT_EQ(::pipe(to_parent), 0);
  ASSERT_EQ(::pipe(to_child), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::unique_ptr<LendBlock> b;
    if (!LendBlock::create(1 << 20, &b)) ::_exit(2);
    for (size_t i = 0; i < b->size(); ++i)
      b->data()[i] = static_cast<std::byte>(i * 7);
    auto wire = encode_lend_ref(*b->ref(b->data() + 4096, 8192));
    char go = 0;
    if (::write(to_parent[1], wire.data(), wire.size()) != static_cast<ssize_t>(wire.size()) ||
        ::read(to_child[0], &go, 1) != 1)
      ::_exit(3);
    ::_exit(0);  // the block is gone from this process
  }
  std::vector<std::byte> wire(256);
  const ssize_t got = ::read(to_parent[0], wire.data(), wire.size());
  ASSERT_GT(got, 0);
  wire.resize(static_cast<size_t>(got));
  LendRef ref;
  ASSERT_TRUE(decode_lend_ref(wire, &ref).is_ok());
  LendReader reader(1);  // a budget of one byte: it keeps only its latest mapping
  std::shared_ptr<const std::byte> range;
  ASSERT_TRUE(reader.pin(ref, &range).is_ok());
  ASSERT_EQ(::write(to_child[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  reader.forget(ref.pid);
  EXPECT_EQ(reader.mapped_bytes(), 0u);
  for (size_t i = 0; i < 8192; ++i)
    ASSERT_EQ(range.get()[i], static_cast<std::byte>((4096 + i) * 7)) << i;
  // Its owner is gone: a new reference to it cannot be opened.
  std::vector<std::byte> out(8192);
  EXPECT_FALSE(LendReader().copy(ref, out.data()).is_ok());
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]})
    ::close(fd);
}

TEST(Lend, TheReferenceRoundTripsAndBadOnesAreRefused) {
  LendRef r{1234, 7, {}, 1 << 20, 4096, 8192};
  r.token[0] = std::byte{9};
  std::vector<std::byte> bytes = encode_lend_ref(r);
  LendRef back;
  ASSERT_TRUE(decode_lend_ref(bytes, &back).is_ok());
  EXPECT_EQ(back, r);
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(decode_lend_ref({bytes.data(), n}, &back).is_ok()) << n;
  auto trailing = bytes;
  trailing.push_back(std::byte{0});
  EXPECT_FALSE(decode_lend_ref(trailing, &back).is_ok());
  auto bad = [&](LendRef v) { return !decode_lend_ref(encode_lend_ref(v), &back).is_ok(); };
  LendRef v = r;
  v.offset = r.block_bytes + 1;
  EXPECT_TRUE(bad(v));
  v = r;
  v.bytes = r.block_bytes - r.offset + 1;
  EXPECT_TRUE(bad(v));
  v = r;
  v.offset = 8;
  v.bytes = UINT64_MAX;  // offset + bytes wraps
  EXPECT_TRUE(bad(v));
  v = r;
  v.fd = -1;
  EXPECT_TRUE(bad(v));
  v = r;
  v.pid = 0;
  EXPECT_TRUE(bad(v));
}

TEST(Lend, ALendingPoolHandsOutSlabPiecesAndReusesThem) {
  BufferPool pool(2, /*lending=*/true);
  Buffer big = pool.acquire(2 << 20);
  auto big_ref = pool.find_lent(big.data(), big.size());
  ASSERT_TRUE(big_ref);
  EXPECT_EQ(big_ref->bytes, size_t{2} << 20);
  EXPECT_EQ(big_ref->block_bytes, size_t{32} << 20);  // one slab
  Buffer small = pool.acquire(4096);
  EXPECT_FALSE(pool.find_lent(small.data(), small.size()));  // below 256 KiB: the heap
  std::vector<Buffer> many;
  for (int i = 0; i < 20; ++i) {  // more than one 32 MiB slab of 2 MiB pieces
    many.push_back(pool.acquire(2 << 20));
    auto ref = pool.find_lent(many.back().data(), many.back().size());
    ASSERT_TRUE(ref) << i;
    // The piece's own slab: its offset and bytes name exactly this buffer.
    EXPECT_LE(ref->offset + ref->bytes, ref->block_bytes) << i;
  }
  std::byte* first = big.data();
  big.reset();
  EXPECT_TRUE(pool.find_lent(first, 16));  // cached: the pool still owns the slab
  Buffer again = pool.acquire(2 << 20);
  EXPECT_EQ(again.data(), first);  // a slab piece always goes back to its list
  BufferPool plain(2);
  Buffer heap = plain.acquire(2 << 20);
  EXPECT_FALSE(plain.find_lent(heap.data(), heap.size()));
  // Each pool knows its own slabs only: no process-wide registry.
  EXPECT_FALSE(plain.find_lent(again.data(), again.size()));
  BufferPool other(2, /*lending=*/true);
  EXPECT_FALSE(other.find_lent(again.data(), again.size()));
}

}  // namespace
}  // namespace pushpull::transport
