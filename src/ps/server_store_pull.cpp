// SPDX-License-Identifier: Apache-2.0
// ServerStore's pulls: a pull (or a pull-back push's answer) waits until the
// worker's pushes are applied, then gets the value or its rows; compressed
// pulls (a round of compressed pushes without an optimizer) get the value's
// encoded form, made once per round with the server's error feedback.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "base/metrics.h"
#include "base/timeline.h"
#include "compress/compressor.h"
#include "ps/server_store.h"
#include "ps/server_store_entry.h"
#include "pushpull/checked.h"

namespace pushpull::ps {

using namespace server_store_detail;

void ServerStore::answer_ready_pulls(Entry& e) {
  if (e.replicating) return;
  auto waiting = std::move(e.waiting);
  e.waiting.clear();
  for (auto& w : waiting) {
    if (e.applied[w.meta.worker] >= w.needs_applied) {
      answer_pull(e, w.meta, w.ranges);
    } else {
      e.waiting.push_back(std::move(w));
    }
  }
}

void ServerStore::answer_pull(Entry& e, const RequestMeta& m, const std::vector<Range>& ranges) {
  PP_TIMELINE_SPAN(timeline::process_node(), e.name, "PULL_REPLY");  // timeline hook
  PP_METRIC_ADD(kServerPulls, 1);                                    // metrics hook
  // A worker behind (backup workers) sees its own round's value.
  const Payload& value = e.value_for(m.worker);
  const ArrayView& v = value.view;
  const size_t esize = dtype_size(v.dtype);
  auto* base = static_cast<const std::byte*>(v.data);
  if (ranges.empty() && &value == &e.value && e.pull_wire.owner) {
    // The round's encoded value: the same bytes for every worker.
    responder_.reply(
        m, Status::ok(), DType::kUInt8,
        {static_cast<const std::byte*>(e.pull_wire.view.data), e.pull_wire.view.nbytes()},
        e.pull_wire.owner);
    return;
  }
  if (ranges.empty()) {
    // The value itself, kept alive (and unchanged: copy on write) until sent.
    responder_.reply(m, Status::ok(), v.dtype, {base, v.nbytes()}, value.owner);
    return;
  }
  // Ranges are distinct rows (the worker deduplicates), so a reply is never
  // larger than the value: more is a request for unbounded memory.
  int64_t total = 0;
  for (const Range& r : ranges)
    if (r.count < 0 || !checked_add(total, r.count, &total) || total > v.numel())
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("pull of key {}: {} ranges ask for more than its {} "
                                        "elements",
                                        e.name, ranges.size(), v.numel())));
  auto gathered = std::make_shared<std::vector<std::byte>>();
  gathered->reserve(static_cast<size_t>(total) * esize);
  for (const Range& r : ranges) {
    if (!range_inside(r.begin, r.count, v.numel()))
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("pull of key {}: range (begin {}, count {}) is outside "
                                        "its {} elements",
                                        e.name, r.begin, r.count, v.numel())));
    gathered->insert(gathered->end(), base + r.begin * esize, base + (r.begin + r.count) * esize);
  }
  responder_.reply(m, Status::ok(), v.dtype, *gathered, gathered);
}

void ServerStore::note_round_codec(Entry& e, bool first, std::optional<compress::Settings> codec) {
  const compress::Settings none;
  if (first) {
    e.round_codec = codec.value_or(none);
  } else if (!codec || *codec != e.round_codec) {
    e.round_codec = none;  // mixed pushes: this round's pulls answer the value itself
  }
}

void ServerStore::compress_for_pulls(Entry& e) {
  const ArrayView& v = e.value.view;
  const auto n = static_cast<size_t>(v.numel());
  if (!e.round_codec.enabled() || v.dtype != DType::kFloat32 || e.value.read_only ||
      e.value.owner.use_count() > 1)
    return;
  const compress::Compressor codec(e.round_codec);
  const size_t bytes = codec.encoded_bytes(n);
  if (bytes >= n * sizeof(float)) return;  // tiny parts: the value itself is smaller
  PP_TIMELINE_SPAN(timeline::process_node(), e.name, "COMPRESS_PULL");  // timeline hook
  if (e.pull_codec != e.round_codec || e.pull_residual.size() != n) {
    e.pull_codec = e.round_codec;  // new settings start from a zero residual
    e.pull_residual.assign(n, 0.0f);
  }
  auto wire = std::make_shared<transport::Buffer>(value_pool_.acquire(bytes));
  compress::write_header(e.pull_codec, wire->data());
  // One pass: the value is encoded and replaced by what every worker decodes,
  // which this server holds from now on (ranges, rejoins, replicas and
  // checkpoints see the same numbers).
  codec.codec().compress_keep(v.as<float>(), e.pull_residual.data(),
                              wire->data() + compress::kHeaderBytes, n);
  e.pull_wire =
      Payload{ArrayView(wire->data(), DType::kUInt8, Shape{static_cast<int64_t>(bytes)}), wire};
}

void ServerStore::pull(const RequestMeta& m, PartId part, std::vector<Range> ranges) {
  executor_.submit(shard_of(part), [this, m, part, ranges = std::move(ranges)] {
    Entry* e = find(part);
    if (!e)
      return fail(m, Status(ErrorCode::kNotFound,
                            fmt::format("pull of key id {} that was never initialised", part.key)));
    if (m.worker < 0 || m.worker >= config_.num_workers)
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("pull from unknown worker {}", m.worker)));
    pull_when_applied(*e, m, ranges);
  });
}

void ServerStore::pull_when_applied(Entry& e, const RequestMeta& m, std::vector<Range> ranges) {
  if (e.applied[m.worker] < e.received[m.worker] || e.replicating) {
    auto queued =
        std::count_if(e.waiting.begin(), e.waiting.end(),
                      [&](const Entry::WaitingPull& w) { return w.meta.worker == m.worker; });
    if (queued >= config_.max_queued_per_worker)
      return fail(m, Status(ErrorCode::kProtocolError,
                            fmt::format("pull of key {}: worker {} already has {} pulls waiting",
                                        e.name, m.worker, queued)));
    e.waiting.push_back({m, std::move(ranges), e.received[m.worker]});
    return;
  }
  answer_pull(e, m, ranges);
}

}  // namespace pushpull::ps
