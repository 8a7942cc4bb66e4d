// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "pushpull/data/idx.h"
#include "pushpull/data/sampler.h"
#include "pushpull/error.h"

namespace pushpull::data {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/pushpull-data-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::vector<uint8_t> idx_bytes(std::vector<uint32_t> dims, uint8_t fill_start) {
  std::vector<uint8_t> b = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  size_t total = 1;
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8)
      b.push_back(static_cast<uint8_t>(d >> s));
    total *= d;
  }
  for (size_t i = 0; i < total; ++i)
    b.push_back(static_cast<uint8_t>(fill_start + i));
  return b;
}

void write_plain(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void write_gz(const std::string& path, const std::vector<uint8_t>& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, b.data(), static_cast<unsigned>(b.size()));
  gzclose(f);
}

TEST(Idx, ReadsPlainAndGzip) {
  TempDir dir;
  auto bytes = idx_bytes({3, 2, 2}, 10);
  write_plain(dir.file("a.idx"), bytes);
  write_gz(dir.file("a.idx.gz"), bytes);
  for (auto name : {"a.idx", "a.idx.gz"}) {
    IdxArray a = read_idx(dir.file(name));
    EXPECT_EQ(a.dims, (std::vector<uint32_t>{3, 2, 2}));
    EXPECT_EQ(a.count(), 3u);
    EXPECT_EQ(a.item_size(), 4u);
    ASSERT_EQ(a.values.size(), 12u);
    EXPECT_EQ(a.values[0], 10);
    EXPECT_EQ(a.values[11], 21);
  }
}

TEST(Idx, ClearErrors) {
  TempDir dir;
  EXPECT_THROW(read_idx(dir.file("missing.gz")), NotFound);

  auto bytes = idx_bytes({4, 3}, 0);
  bytes[0] = 0x1f;
  write_plain(dir.file("magic"), bytes);
  try {
    read_idx(dir.file("magic"));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bad magic"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("magic"), std::string::npos);
  }

  auto good = idx_bytes({4, 3}, 0);
  good.resize(good.size() - 2);
  write_gz(dir.file("trunc.gz"), good);
  try {
    read_idx(dir.file("trunc.gz"));
    FAIL();
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("truncated"), std::string::npos) << m;
    EXPECT_NE(m.find("trunc.gz"), std::string::npos) << m;
    EXPECT_NE(m.find("expected 12"), std::string::npos) << m;
  }
}

// A header only: `dims` as big-endian uint32s, and `data` bytes after it.
std::vector<uint8_t> idx_header(const std::vector<uint32_t>& dims, size_t data) {
  std::vector<uint8_t> b = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8)
      b.push_back(static_cast<uint8_t>(d >> s));
  b.resize(b.size() + data, 7);
  return b;
}

// 65536^4 = 2^64 wraps to 0 bytes in unchecked 64-bit size math: without the
// check, this 20-byte file "holds" a 2^64-byte array and reads as empty.
TEST(Idx, DimensionProductThatWrapsToZeroIsRefused) {
  TempDir dir;
  write_plain(dir.file("wrap"), idx_header({65536, 65536, 65536, 65536}, 0));
  try {
    read_idx(dir.file("wrap"));
    FAIL() << "a header whose dimensions wrap to 0 bytes was accepted";
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("overflows"), std::string::npos) << m;
    EXPECT_NE(m.find("wrap"), std::string::npos) << m;  // names the file
    EXPECT_NE(m.find("65536x65536x65536x65536"), std::string::npos) << m;
  }
  // Wrapping to a small non-zero size (2^64 + 4) is refused as well.
  write_plain(dir.file("wrap4"), idx_header({65536, 65536, 65536, 65537}, 64));
  EXPECT_THROW(read_idx(dir.file("wrap4")), InvalidArgument);
  // A first dimension of 0 does not hide an item size that overflows.
  write_plain(dir.file("zero"), idx_header({0, 0xffffffff, 0xffffffff, 0xffffffff}, 0));
  EXPECT_THROW(read_idx(dir.file("zero")), InvalidArgument);
  // An honest empty file still reads.
  write_plain(dir.file("empty"), idx_header({0, 28, 28}, 0));
  IdxArray a = read_idx(dir.file("empty"));
  EXPECT_EQ(a.count(), 0u);
  EXPECT_EQ(a.item_size(), 28u * 28u);
}

TEST(Idx, LoadMnistChecksCounts) {
  TempDir dir;
  write_gz(dir.file("train-images-idx3-ubyte.gz"), idx_bytes({5, 2, 3}, 0));
  write_gz(dir.file("train-labels-idx1-ubyte.gz"), idx_bytes({5}, 0));
  ImageDataset d = load_mnist(fs::path(dir.file("")).parent_path().string(), "train");
  EXPECT_EQ(d.count, 5u);
  EXPECT_EQ(d.rows, 2u);
  EXPECT_EQ(d.cols, 3u);
  EXPECT_FLOAT_EQ(d.images[1], 1 / 255.0f);
  EXPECT_EQ(d.labels[4], 4);
  write_gz(dir.file("t10k-images-idx3-ubyte.gz"), idx_bytes({5, 2, 3}, 0));
  write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), idx_bytes({4}, 0));
  EXPECT_THROW(load_mnist(fs::path(dir.file("")).parent_path().string(), "t10k"), InvalidArgument);
}

TEST(Idx, FashionMnistFromDebianPackage) {
  if (!fs::exists(std::string(kFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (make deps installs it)";
  ImageDataset d = load_mnist(kFashionMnistDir, "t10k");
  EXPECT_EQ(d.count, 10000u);
  EXPECT_EQ(d.rows, 28u);
  EXPECT_EQ(d.cols, 28u);
  std::set<int> classes(d.labels.begin(), d.labels.end());
  EXPECT_EQ(classes.size(), 10u);
}

TEST(SplitSampler, PartsAreDisjointEqualAndCover) {
  const size_t length = 1003;
  for (size_t parts : {1u, 2u, 3u, 4u, 7u}) {
    std::set<size_t> seen;
    for (size_t p = 0; p < parts; ++p) {
      SplitSampler s(length, parts, p, 42);
      EXPECT_EQ(s.size(), length / parts);
      auto idx = s.indices(0);
      EXPECT_EQ(idx.size(), length / parts);
      for (size_t i : idx) {
        EXPECT_LT(i, length);
        EXPECT_TRUE(seen.insert(i).second) << "index " << i << " in two parts";
      }
    }
    EXPECT_EQ(seen.size(), length - length % parts);  // only the remainder is dropped
  }
}

TEST(SplitSampler, PaddingGivesEqualPartsCoveringAll) {
  std::set<size_t> seen;
  for (size_t p = 0; p < 4; ++p) {
    SplitSampler s(10, 4, p, 1, Remainder::kPad);
    EXPECT_EQ(s.size(), 3u);
    for (size_t i : s.indices(3))
      seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 10u);
}

TEST(SplitSampler, ReproducibleShuffledPerEpoch) {
  SplitSampler a(500, 2, 1, 7), b(500, 2, 1, 7), c(500, 2, 1, 8);
  EXPECT_EQ(a.indices(0), b.indices(0));
  EXPECT_NE(a.indices(0), a.indices(1));
  EXPECT_NE(a.indices(0), c.indices(0));
  auto sorted = a.indices(5);
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted.front(), 250u);
  EXPECT_EQ(sorted.back(), 499u);
  SplitSampler plain(10, 2, 0, 0, Remainder::kDrop, false);
  EXPECT_EQ(plain.indices(3), (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(plain.num_batches(2), 3u);
}

TEST(SplitSampler, BadArguments) {
  EXPECT_THROW(SplitSampler(10, 0, 0), InvalidArgument);
  EXPECT_THROW(SplitSampler(10, 2, 2), InvalidArgument);
  EXPECT_THROW(SplitSampler(3, 4, 0), InvalidArgument);
}

}  // namespace
}  // namespace pushpull::data
