// SPDX-License-Identifier: Apache-2.0
#include "pushpull/data/idx.h"

#include <zlib.h>

#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "data/idx_decode.h"
#include "pushpull/checked.h"
#include "pushpull/error.h"

namespace pushpull::data {

size_t IdxArray::item_size() const {
  size_t n = 1;
  for (size_t i = 1; i < dims.size(); ++i)
    n *= dims[i];
  return n;
}

namespace {

// Reads the whole file (gz or plain: gzread passes plain files through).
std::vector<uint8_t> read_all(const std::string& path) {
  if (!std::filesystem::exists(path))
    throw NotFound(
        fmt::format("IDX file '{}' does not exist (install the Debian package "
                    "dataset-fashion-mnist, or point --data-dir at the files)",
                    path));
  struct GzCloser {
    void operator()(gzFile f) const { gzclose(f); }
  };
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) throw IoError(fmt::format("cannot open IDX file '{}'", path));
  gzbuffer(f.get(), 1 << 20);
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    int n = gzread(f.get(), chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int err = 0;
      const char* msg = gzerror(f.get(), &err);
      throw InvalidArgument(fmt::format("IDX file '{}' is corrupt: {}", path, msg ? msg : "?"));
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  return out;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

IdxArray decode_idx(std::span<const uint8_t> bytes, std::string_view source) {
  const std::string path(source);
  if (bytes.size() < 4)
    throw InvalidArgument(
        fmt::format("IDX file '{}' is truncated: {} bytes, expected at least a 4-byte header", path,
                    bytes.size()));
  if (bytes[0] != 0 || bytes[1] != 0)
    throw InvalidArgument(fmt::format(
        "'{}' is not an IDX file: bad magic number 0x{:02x}{:02x}{:02x}{:02x} (expected "
        "0x0000TTNN)",
        path, bytes[0], bytes[1], bytes[2], bytes[3]));
  if (bytes[2] != 0x08)
    throw InvalidArgument(
        fmt::format("IDX file '{}' holds type 0x{:02x}; only unsigned bytes (0x08) are supported",
                    path, bytes[2]));
  size_t ndim = bytes[3];
  if (ndim == 0 || ndim > 4)
    throw InvalidArgument(
        fmt::format("IDX file '{}' has {} dimensions; expected 1 to 4", path, ndim));
  size_t header = 4 + 4 * ndim;
  if (bytes.size() < header)
    throw InvalidArgument(fmt::format("IDX file '{}' is truncated in its header", path));
  IdxArray a;
  for (size_t i = 0; i < ndim; ++i)
    a.dims.push_back(be32(&bytes[4 + 4 * i]));
  // Checked: four 32-bit dimensions can multiply past 2^64 and wrap (to 0
  // with 65536^4), which would pass the size check below with no data.
  // The item size (dimensions after the first) is checked on its own:
  // with a first dimension of 0 it is not bounded by the total.
  size_t item = 1, total = 0;
  for (size_t i = 1; i < ndim; ++i)
    if (!checked_mul<size_t>(item, a.dims[i], &item))
      throw InvalidArgument(
          fmt::format("IDX file '{}' has dimensions {} whose product overflows 64 bits", path,
                      fmt::join(a.dims, "x")));
  if (!checked_mul<size_t>(item, a.dims[0], &total))
    throw InvalidArgument(
        fmt::format("IDX file '{}' has dimensions {} whose product overflows 64 bits", path,
                    fmt::join(a.dims, "x")));
  if (bytes.size() - header < total)
    throw InvalidArgument(
        fmt::format("IDX file '{}' is truncated: {} data bytes, expected {} for dimensions {}",
                    path, bytes.size() - header, total, fmt::join(a.dims, "x")));
  a.values.assign(bytes.begin() + static_cast<ptrdiff_t>(header),
                  bytes.begin() + static_cast<ptrdiff_t>(header + total));
  return a;
}

IdxArray read_idx(const std::string& path) {
  std::vector<uint8_t> bytes = read_all(path);
  return decode_idx(bytes, path);
}

ImageDataset load_mnist(const std::string& dir, const std::string& prefix) {
  auto pick = [&](const std::string& stem) {
    std::string gz = fmt::format("{}/{}.gz", dir, stem);
    return std::filesystem::exists(gz) ? gz : fmt::format("{}/{}", dir, stem);
  };
  std::string image_path = pick(prefix + "-images-idx3-ubyte");
  std::string label_path = pick(prefix + "-labels-idx1-ubyte");
  IdxArray images = read_idx(image_path);
  IdxArray labels = read_idx(label_path);
  if (images.dims.size() != 3)
    throw InvalidArgument(fmt::format("'{}' should hold N x rows x cols images, has {} dimensions",
                                      image_path, images.dims.size()));
  if (labels.dims.size() != 1 || labels.count() != images.count())
    throw InvalidArgument(fmt::format("'{}' has {} labels for {} images in '{}'", label_path,
                                      labels.count(), images.count(), image_path));
  ImageDataset d;
  d.count = images.count();
  d.rows = images.dims[1];
  d.cols = images.dims[2];
  d.images.resize(images.values.size());
  for (size_t i = 0; i < images.values.size(); ++i)
    d.images[i] = images.values[i] / 255.0f;
  d.labels = std::move(labels.values);
  return d;
}

}  // namespace pushpull::data
