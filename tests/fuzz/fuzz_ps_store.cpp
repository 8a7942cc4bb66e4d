// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the parameter server's request handling behind the decoders:
// a sequence of init / push (plain or 2-bit compressed) / pull requests with
// attacker-chosen keys, offsets, dtypes, lengths and ranges, fed to a
// ServerStore the way ps/server.cpp feeds it (the same size checks: an init's
// bytes must be length x dtype size, a push whole elements). The store must
// answer every request (reply or error) and never crash, overflow or throw.
//
// Input: byte 0 picks 1 to 3 workers (bits 0-1 mod 3), backup workers
// (bits 2-3, mod workers) and their lateness bound (bits 4-5), then records
//   u8 op, u8 worker, u8 dtype, u8 flags, u64 key, i64 offset, i64 length,
//   u16 payload size, payload. A push's flags: bit 0 compressed, bit 5
//   (kFlagPullBack) answered with the value.
#include <chrono>
#include <memory>
#include <vector>

#include "fuzz_input.h"
#include "ps/protocol.h"
#include "ps/server_store.h"
#include "transport/wire.h"

using namespace pushpull;
using namespace pushpull::ps;

namespace {

struct Counter : ServerResponder {
  void reply(const RequestMeta&, const Status&, DType, std::span<const std::byte>,
             std::shared_ptr<void>) override {
    ++replies;
  }
  std::atomic<int> replies{0};
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  const int workers = 1 + sel % 3;
  Counter responder;
  {
    ServerStoreConfig config{workers, true, 1, 0};
    // Backup workers (docs/ps.md): 0 .. workers - 1, lateness bound 1 .. 3.
    config.backup_workers = (sel >> 2) % workers;
    config.backup_max_late = 1 + (sel >> 4) % 3;
    ServerStore store(config, responder);
    transport::Reader r(in);
    for (int i = 0; i < 64 && !r.at_end(); ++i) {
      const auto op = r.u<uint8_t>() % 3;
      const int worker = r.u<uint8_t>() % workers;
      const auto raw_dtype = r.u<uint8_t>();
      const auto flags = r.u<uint8_t>();
      const auto key = r.u<uint64_t>() % 4;
      const auto offset = static_cast<int64_t>(r.u<uint64_t>() % 64);
      const auto length = static_cast<int64_t>(r.u<uint64_t>());
      const auto n = r.u<uint16_t>();
      auto owner = std::make_shared<std::vector<std::byte>>(n);
      if (!r.bytes(*owner)) break;
      RequestMeta meta{worker, static_cast<uint64_t>(i), key};
      const PartId part{key, offset};
      if (!is_valid_dtype(raw_dtype)) continue;  // the server rejects these first
      const auto dtype = static_cast<DType>(raw_dtype);
      const size_t elem = dtype_size(dtype);
      if (op == 0) {
        std::string name;
        std::span<const std::byte> value;
        if (!decode_init(*owner, &name, &value).is_ok()) continue;
        if (length < 0 || value.size() / elem != static_cast<uint64_t>(length) ||
            value.size() % elem != 0)
          continue;
        ArrayView view(const_cast<std::byte*>(value.data()), dtype, Shape{length});
        store.init(meta, part, name, Payload{view, owner});
      } else if (op == 1) {
        const bool compressed = flags & 1;
        meta.pull_back = (flags & msg::kFlagPullBack) != 0;  // a pushpull: answered with the value
        if (!compressed && owner->size() % elem != 0) continue;
        const auto count = static_cast<int64_t>(compressed ? owner->size() : owner->size() / elem);
        ArrayView view(owner->data(), compressed ? DType::kUInt8 : dtype, Shape{count});
        store.push(meta, part, Payload{view, owner}, compressed);
      } else {
        std::vector<Range> ranges;
        if (!decode_ranges(*owner, &ranges).is_ok()) continue;
        store.pull(meta, part, std::move(ranges));
      }
    }
    store.wait_idle(std::chrono::seconds(10));
  }
  return 0;
}
