// SPDX-License-Identifier: Apache-2.0
// Plain driver for the fuzz targets when libFuzzer is not used (the g++
// build): runs every file of the given corpus directories, then mutated
// copies of them (bit flips, byte changes, inserted and removed bytes, large
// little-endian integers written over length fields, truncation, splices)
// until -runs=N inputs or -max_total_time=S seconds, whichever comes first.
// Same arguments as libFuzzer for the ones it knows; prints the count.
// Deterministic for a given -seed=N. Aborts on a single allocation above
// 16 MiB (see kMaxAllocation).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// A decoder must not allocate far more than its input: one allocation above
// this from an input of a few KiB is an amplification bug (libFuzzer runs use
// -malloc_limit_mb for the same check).
constexpr size_t kMaxAllocation = size_t{16} << 20;

void* operator new(size_t n) {
  if (n > kMaxAllocation) {
    std::fprintf(stderr, "FINDING: one allocation of %zu bytes from a fuzz input (limit %zu)\n", n,
                 kMaxAllocation);
    std::abort();
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  return operator new(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}

namespace {

using Bytes = std::vector<uint8_t>;

void mutate(Bytes& b, std::mt19937_64& rng, const std::vector<Bytes>& corpus) {
  auto pick = [&](size_t n) { return n ? static_cast<size_t>(rng() % n) : 0; };
  const int steps = 1 + static_cast<int>(rng() % 4);
  for (int s = 0; s < steps; ++s) {
    switch (rng() % 8) {
      case 0:
        if (!b.empty()) b[pick(b.size())] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:
        if (!b.empty()) b[pick(b.size())] = static_cast<uint8_t>(rng());
        break;
      case 2:
        b.insert(b.begin() + static_cast<ptrdiff_t>(pick(b.size() + 1)),
                 static_cast<uint8_t>(rng()));
        break;
      case 3:
        if (!b.empty()) b.erase(b.begin() + static_cast<ptrdiff_t>(pick(b.size())));
        break;
      case 4: {  // an interesting integer over a possible length / count field
        static const uint64_t values[] = {0,          1,          0x7f,       0xff,
                                          0x7fff,     0xffff,     0x7fffffff, 0x80000000,
                                          0xffffffff, 1ull << 32, 1ull << 62, ~0ull};
        // Half the time a random magnitude (counts just under a decoder's cap).
        uint64_t v = rng() % 2 ? values[rng() % std::size(values)] : rng() >> (rng() % 64);
        const size_t width = size_t{1} << (rng() % 4);
        if (b.size() >= width) {
          size_t at = pick(b.size() - width + 1);
          for (size_t i = 0; i < width; ++i)
            b[at + i] = static_cast<uint8_t>(v >> (8 * i));
        }
        break;
      }
      case 5:
        if (!b.empty()) b.resize(pick(b.size()));
        break;
      case 6: {  // splice in part of another corpus entry
        const Bytes& o = corpus[pick(corpus.size())];
        if (!o.empty()) {
          size_t from = pick(o.size()), n = 1 + pick(o.size() - from);
          b.insert(b.begin() + static_cast<ptrdiff_t>(pick(b.size() + 1)),
                   o.begin() + static_cast<ptrdiff_t>(from),
                   o.begin() + static_cast<ptrdiff_t>(from + n));
        }
        break;
      }
      default:
        if (!b.empty()) b[0] = static_cast<uint8_t>(rng());  // another decoder
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t runs = 20000, seed = 1;
  double max_time = 10;
  std::vector<Bytes> corpus;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("-runs=", 0) == 0) {
      runs = std::stoull(a.substr(6));
    } else if (a.rfind("-max_total_time=", 0) == 0) {
      max_time = std::stod(a.substr(16));
    } else if (a.rfind("-seed=", 0) == 0) {
      seed = std::stoull(a.substr(6));
    } else if (a.rfind("-", 0) == 0) {
      continue;  // libFuzzer options this driver does not have
    } else if (std::filesystem::is_directory(a)) {
      for (const auto& e : std::filesystem::directory_iterator(a)) {
        std::ifstream f(e.path(), std::ios::binary);
        corpus.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      }
    }
  }
  if (corpus.empty()) corpus.push_back({});
  const auto start = std::chrono::steady_clock::now();
  uint64_t done = 0;
  for (const Bytes& b : corpus) {
    LLVMFuzzerTestOneInput(b.data(), b.size());
    ++done;
  }
  std::mt19937_64 rng(seed);
  Bytes b;
  while (done < runs) {
    if (done % 256 == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= max_time)
      break;
    if (rng() % 4 == 0) {
      b.resize(rng() % 512);  // random bytes
      for (auto& x : b)
        x = static_cast<uint8_t>(rng());
    } else {
      b = corpus[rng() % corpus.size()];
      mutate(b, rng, corpus);
    }
    LLVMFuzzerTestOneInput(b.data(), b.size());
    ++done;
  }
  std::printf("Done %llu runs in %.1f s (plain driver, %zu corpus inputs)\n",
              static_cast<unsigned long long>(done),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              corpus.size());
  return 0;
}
