// SPDX-License-Identifier: Apache-2.0
// Worker program of the TLS wire test (tests/security/tls_wire_test.py):
// pushes a 1 MiB float32 tensor whose bytes are a distinctive marker (the
// ASCII text kMarker repeated, each 4 bytes a normal float) to a store of
// type --kvstore (dist_sync: the servers sum the pushes; dist_sync_allreduce:
// the workers allreduce them), pulls the sum and checks every element is
// num_workers times the pushed one (exact for 2 workers: a power of two).
// The test looks for the marker's bytes on the wire: there in a plain job,
// absent under TLS. Prints "PASS" and exits 0, "FAIL <what>" (1) or "ERROR
// <code>: <msg>" (3).
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "pushpull/error.h"
#include "pushpull/kvstore.h"

namespace {

// 32 bytes; the test script has the same text. Every 4th byte (a float's
// sign and exponent) is printable ASCII, so every float is normal and twice
// it is too.
constexpr char kMarker[] = "pushpull/tls-wire/marker:7f3a9c!";
constexpr int64_t kFloats = (1 << 20) / 4;  // 1 MiB

}  // namespace

int main(int argc, char** argv) {
  using pushpull::Array;
  using pushpull::Shape;
  static_assert((sizeof kMarker - 1) % 4 == 0);
  std::string type = "dist_sync";
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--kvstore") type = argv[i + 1];
  try {
    auto options = pushpull::Options::from_env();
    pushpull::set_log_level(options.log_level);
    auto kv = pushpull::create_kvstore(type, options);
    const int n = kv->num_workers();
    Array grad(Shape{kFloats}, pushpull::DType::kFloat32);
    auto* bytes = reinterpret_cast<unsigned char*>(grad.as<float>());
    for (size_t i = 0; i < kFloats * sizeof(float); ++i)
      bytes[i] = static_cast<unsigned char>(kMarker[i % (sizeof kMarker - 1)]);
    Array weight = Array::full(Shape{kFloats}, 0.0);
    kv->init(7, weight.view());
    kv->push(7, grad.view());
    kv->pull(7, weight.view());
    kv->wait_all();
    const float* g = grad.as<float>();
    const float* got = weight.as<float>();
    for (int64_t i = 0; i < kFloats; ++i) {
      const float want = static_cast<float>(n * static_cast<double>(g[i]));
      if (std::memcmp(&got[i], &want, sizeof want) != 0) {
        fmt::print("FAIL element {}: got {} want {}\n", i, got[i], want);
        std::fflush(stdout);
        return 1;
      }
    }
    kv->barrier();
    fmt::print("PASS rank {} of {}: {} elements as expected\n", kv->rank(), n, kFloats);
  } catch (const pushpull::Error& e) {
    fmt::print("ERROR {}: {}\n", pushpull::error_code_name(e.code()), e.what());
    std::fflush(stdout);
    return 3;
  }
  return 0;
}
