// SPDX-License-Identifier: Apache-2.0
// The schedule executor over post_send/post_recv (schedule.h), what every
// transport without a path of its own runs.
#include "transport/schedule.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "transport/transport.h"

namespace pushpull::transport {
namespace {

// Receives posted ahead of the one waited for: enough to keep a pipelined
// ring's segments in flight while one is reduced, each scratch receive in
// a slot of its own.
constexpr size_t kWindow = 4;

}  // namespace

size_t Schedule::scratch_bytes() const {
  size_t most = 0;
  for (const auto& r : recvs)
    if (r.dst == nullptr) most = std::max(most, r.bytes);
  return most;
}

void run_posted(Transport& t, const Schedule& s) {
  const size_t n = s.recvs.size(), esize = dtype_size(s.dtype);
  const size_t slot = s.scratch_bytes();
  size_t nscratch = 0;
  for (const auto& r : s.recvs)
    nscratch += r.dst == nullptr;
  // Receive i is posted once receive i - kWindow is done, so scratch
  // receive j's slot (j % slots) was last used by a receive already done.
  const size_t slots = std::min(kWindow, nscratch);
  if (slots > 0 && s.scratch->size() < slots * slot) s.scratch->resize(slots * slot);
  std::vector<char*> dst(n);
  for (size_t i = 0, j = 0; i < n; ++i)
    dst[i] = s.recvs[i].dst ? static_cast<char*>(s.recvs[i].dst)
                            : s.scratch->data() + (j++ % slots) * slot;

  std::vector<Request> sends;
  sends.reserve(s.sends.size());
  std::vector<std::optional<Request>> recvs(n);
  size_t next_send = 0, posted = 0, sent = 0;
  auto wait_sends = [&] {
    for (; sent < sends.size(); ++sent)
      sends[sent].wait(Clock::now() + s.timeout,
                       fmt::format("{}: message {:#x} to rank {}", s.what, s.sends[sent].tag,
                                   s.sends[sent].peer));
  };
  auto progress = [&](size_t done) {
    for (; next_send < s.sends.size() && s.sends[next_send].after <= done; ++next_send) {
      const auto& x = s.sends[next_send];
      sends.push_back(isend(t, x.peer, x.tag, x.data, x.bytes));
    }
    for (; posted < n && posted < done + kWindow; ++posted) {
      const auto& r = s.recvs[posted];
      recvs[posted] = irecv(t, r.peer, r.tag, dst[posted], r.bytes);
    }
  };
  progress(0);
  for (size_t i = 0; i < n; ++i) {
    const auto& r = s.recvs[i];
    recvs[i]->wait(Clock::now() + s.timeout,
                   fmt::format("{}: message {:#x} from rank {}", s.what, r.tag, r.peer));
    recvs[i].reset();
    if (r.after_sends) wait_sends();
    if (r.reduce_into) reduce(s.op, s.dtype, r.reduce_into, dst[i], r.bytes / esize);
    progress(i + 1);
  }
  wait_sends();
}

std::vector<Block> even_blocks(size_t count, int n) {
  std::vector<Block> out(static_cast<size_t>(n));
  size_t base = count / static_cast<size_t>(n), extra = count % static_cast<size_t>(n), off = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].offset = off;
    out[i].count = base + (i < extra ? 1 : 0);
    off += out[i].count;
  }
  return out;
}

}  // namespace pushpull::transport
