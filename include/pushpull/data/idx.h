// SPDX-License-Identifier: Apache-2.0
// Reader for the IDX format of MNIST and Fashion-MNIST (plain or gzip).
//
// An IDX file is a big-endian header (two zero bytes, a type code, the number
// of dimensions, then one uint32 per dimension) followed by the data. Only
// unsigned bytes (type 0x08) are read here: that is what the image and label
// files hold.
//
// Errors: NotFound for a missing file; InvalidArgument for a bad magic number,
// an unsupported type, or a truncated file, naming the file and what was
// expected. Thread safety: free functions, no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pushpull::data {

struct IdxArray {
  std::vector<uint32_t> dims;   // e.g. {60000, 28, 28} or {60000}
  std::vector<uint8_t> values;  // row-major, dims product bytes
  size_t count() const { return dims.empty() ? 0 : dims[0]; }
  // Elements per item (product of the dimensions after the first).
  size_t item_size() const;
};

// Reads `path`; a name ending in ".gz" is decompressed (zlib), others are read
// as plain files.
IdxArray read_idx(const std::string& path);

// A labelled image set: images as float32 in [0, 1], N x rows x cols.
struct ImageDataset {
  size_t count = 0;
  size_t rows = 0;
  size_t cols = 0;
  std::vector<float> images;
  std::vector<uint8_t> labels;
};

// Loads "<dir>/<prefix>-images-idx3-ubyte[.gz]" and the matching labels
// (prefix "train" or "t10k"), preferring the .gz names when both exist.
// Checks that the two files agree on the number of items.
ImageDataset load_mnist(const std::string& dir, const std::string& prefix);

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

}  // namespace pushpull::data
