// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/shm_data_transport.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pushpull/log.h"
#include "transport/shm/shm_host.h"

namespace pushpull::transport {
namespace {

constexpr uint64_t kHostTag = kControlTagBit | 0x53484d484f5354ull;   // "SHMHOST"
constexpr uint64_t kProofTag = kControlTagBit | 0x53484d50524f46ull;  // "SHMPROF"
// The setup's agreements (ShmOptions::agree): "SHMAGR" + the step.
constexpr uint64_t kAgreeTag = kControlTagBit | 0x53484d41475200ull;

bool is_control(uint64_t tag) {
  return (tag & kControlTagBit) != 0;
}

// Gathers every member's `mine` (as many bytes each) among `group` (the
// job's ranks, ascending, this rank among them): rows[i] is group[i]'s.
// Bruck's allgather: log2(size) rounds, round k with the members 2^k away
// either way, so it uses only the mesh's start-up links
// (tcp_transport.h mesh_partners) and opens no connection per pair.
std::vector<std::vector<uint8_t>> exchange_among(TcpTransport& tcp, const std::vector<int>& group,
                                                 uint64_t tag, const std::vector<uint8_t>& mine,
                                                 Deadline deadline, std::string_view what) {
  const int n = static_cast<int>(group.size());
  const int me =
      static_cast<int>(std::find(group.begin(), group.end(), tcp.rank()) - group.begin());
  const size_t w = mine.size();
  // acc holds the rows of members me, me + 1, ... (mod n), in that order.
  std::vector<uint8_t> acc(static_cast<size_t>(n) * w);
  std::copy(mine.begin(), mine.end(), acc.begin());
  uint64_t round = 1;
  for (int d = 1; d < n; d *= 2, ++round) {
    const size_t cnt = static_cast<size_t>(std::min(d, n - d));
    // The round in bits 56..62 (the tags' own bits are below).
    const uint64_t t = tag ^ (round << 56);
    Request rv = irecv(tcp, group[static_cast<size_t>((me + d) % n)], t,
                       acc.data() + static_cast<size_t>(d) * w, cnt * w);
    Request sd = isend(tcp, group[static_cast<size_t>((me - d + n) % n)], t, acc.data(), cnt * w);
    rv.wait(deadline, what);
    sd.wait(deadline, what);
  }
  std::vector<std::vector<uint8_t>> rows(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const auto* row = acc.data() + static_cast<size_t>(i) * w;
    rows[static_cast<size_t>((me + i) % n)].assign(row, row + w);
  }
  return rows;
}

// The same among every rank of the job: rows[r] is rank r's.
std::vector<std::vector<uint8_t>> exchange(TcpTransport& tcp, uint64_t tag,
                                           const std::vector<uint8_t>& mine, Deadline deadline,
                                           std::string_view what) {
  std::vector<int> all(static_cast<size_t>(tcp.size()));
  for (int r = 0; r < tcp.size(); ++r)
    all[static_cast<size_t>(r)] = r;
  return exchange_among(tcp, all, tag, mine, deadline, what);
}

size_t ring_bytes_for(const ShmOptions& o, size_t group) {
  // The segment's size (shm_transport.cpp), rounded up generously.
  return (o.ring_bytes + 4096) * group + 2 * o.arena_slot_bytes + 8192;
}

}  // namespace

ShmDataTransport::ShmDataTransport(std::unique_ptr<TcpTransport> tcp,
                                   std::unique_ptr<ShmTransport> shm, std::vector<int> group)
    : tcp_(std::move(tcp)), shm_(std::move(shm)), group_(std::move(group)) {
  local_.assign(static_cast<size_t>(tcp_->size()), -1);
  for (size_t i = 0; i < group_.size(); ++i)
    local_.at(static_cast<size_t>(group_[i])) = static_cast<int>(i);
  if (!shm_) return;  // a rank alone on its host (see use_shared_memory)
  // A weak reference: the hook may run (from TCP's threads) while this
  // object is being destroyed; the TCP transport is closed first anyway.
  tcp_->on_verdict([weak = std::weak_ptr<ShmTransport>(shm_)](const Status& verdict) {
    if (auto shm = weak.lock()) shm->declare(verdict);
  });  // A verdict decided before the hook was set.
  if (std::optional<Status> v = tcp_->verdict()) shm_->declare(*v);
}

ShmDataTransport::~ShmDataTransport() {
  close(Status(ErrorCode::kPeerFailure,
               fmt::format("collective: rank {} closed its transport", tcp_->rank())));
}

int ShmDataTransport::local(int peer) const {
  return peer >= 0 && peer < static_cast<int>(local_.size()) ? local_[static_cast<size_t>(peer)]
                                                             : -1;
}

void ShmDataTransport::post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                                 Completion done) {
  const int l = local(peer);
  if (is_control(tag) || l < 0)
    tcp_->post_send(peer, tag, data, bytes, std::move(done));
  else
    shm_->post_send(l, tag, data, bytes, std::move(done));
}

void ShmDataTransport::post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) {
  const int l = local(peer);
  if (is_control(tag) || l < 0)
    tcp_->post_recv(peer, tag, dst, bytes, std::move(done));
  else
    shm_->post_recv(l, tag, dst, bytes, std::move(done));
}

bool ShmDataTransport::streams_for(size_t message_bytes) const {
  return message_bytes < stream_below_ && tcp_->has_streams();
}

void ShmDataTransport::run(const Schedule& s) {
  if (streams_for(s.message_bytes))
    tcp_->run(s);
  else
    run_posted(*this, s);
}

HostCollectives* ShmDataTransport::host_collectives() {
  return shm_ && group_.size() == static_cast<size_t>(tcp_->size()) ? shm_->host_collectives()
                                                                    : nullptr;
}

void ShmDataTransport::close(const Status& reason) {
  tcp_->close(reason);  // says goodbye first: the peers do not suspect this rank
  if (shm_) shm_->close(reason);
}

void ShmDataTransport::abort(const Status& why) {
  tcp_->abort(why);  // the verdict reaches the peers (and shm_, through the hook)
  if (shm_) shm_->close(why);
}

std::unique_ptr<Transport> use_shared_memory(std::unique_ptr<TcpTransport> tcp,
                                             const CollectiveOptions& c, Millis startup,
                                             const std::string& dir,
                                             const SegmentsHook& before_segments) {
  if (!c.shared_memory || tcp->size() < 2) return tcp;
  const uint64_t stream_below = c.shm_min_message_bytes;
  const int rank = tcp->rank(), size = tcp->size();
  const auto deadline = Clock::now() + startup;
  ShmOptions o;
  o.arena_slot_bytes = static_cast<size_t>(c.shm_arena_slot_bytes);
  o.arena_chunk_bytes = static_cast<size_t>(c.shm_arena_step_bytes);
  o.arena_stores = parse_slot_stores(c.shm_arena_stores).value_or(SlotStores::kAuto);
  // Every rank takes part in both exchanges, even one that cannot make a
  // probe (it proves nothing): the others must not wait for it.
  std::unique_ptr<HostProbe> probe;
  RankRecord mine;
  sweep_stale_files(dir);  // what ranks killed mid-setup left
  try {
    probe = std::make_unique<HostProbe>(dir);
    mine = probe->record();
  } catch (const IoError& e) {
    PP_INFO("collective: rank {} cannot use shared memory: {}", rank, e.what());
    mine.host.key = fmt::format("no shared memory: rank {}", rank);
  }
  auto rows = exchange(*tcp, kHostTag, encode(mine), deadline, "collective: host records");
  std::vector<RankRecord> records;
  for (const auto& row : rows)
    records.push_back(decode_rank_record(row.data(), row.size()));
  // The proof row: which candidates' probes this rank sees, and (its own
  // entry) whether its segment's bytes could be reserved.
  const std::vector<int> candidates = same_key(records, rank);
  std::vector<uint8_t> seen(static_cast<size_t>(size), 0);
  // The rings' size for this host's ranks (the same on each: they all see
  // the same candidates).
  o.ring_bytes = ring_bytes_for_ranks(o.ring_bytes, candidates.size());
  if (probe && candidates.size() >= 2) {
    for (int p : candidates)
      seen[static_cast<size_t>(p)] = p == rank
                                         ? probe->reserve(ring_bytes_for(o, candidates.size()))
                                         : probe->sees(records[static_cast<size_t>(p)]);
  }
  auto proof = exchange(*tcp, kProofTag, seen, deadline, "collective: shared-memory proofs");
  if (probe) probe->remove();  // every peer has looked at it (it sent its proof)
  std::vector<int> group = shm_group(records, proof, rank);
  if (group.empty()) {
    if (candidates.size() >= 2)
      PP_INFO("collective: rank {} keeps TCP: ranks {} look like one host but cannot all share {}",
              rank, fmt::join(candidates, ","), dir);
    // Every rank must make the same choice of path (direct streams or
    // post_send/recv) for an operation: when other ranks of the job use
    // shared memory (no streams), this one gives its streams up too.
    bool others_share = false;
    for (int r = 0; r < size && !others_share; ++r)
      others_share = !shm_group(records, proof, r).empty();
    if (!others_share) return tcp;
    auto alone = std::make_unique<ShmDataTransport>(std::move(tcp), nullptr, std::vector<int>{});
    alone->set_stream_below(stream_below);
    return alone;
  }
  // Every rank's segment is named by that rank's own random 128 bits
  // (RankRecord::token, RAND_bytes, sent only over the authenticated mesh):
  // a name that shows in /dev/shm says nothing about the others', so no
  // local user can create a peer's name first.
  std::vector<std::string> names;
  for (int r : group) {
    const auto& token = records[static_cast<size_t>(r)].token;
    names.push_back("pushpull-coll-" + to_hex(token.data(), token.size()));
  }
  const int me = static_cast<int>(std::find(group.begin(), group.end(), rank) - group.begin());
  o.connect_timeout = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  o.rank_names = group;
  o.segment_names = names;
  // The group agrees after each step of the setup, so a segment that
  // cannot be made or mapped (squatted, refused, no room) sends the whole
  // group back to TCP together.
  std::vector<uint8_t> agreed;
  uint64_t step = 0;
  o.agree = [&](bool ok) {
    auto rows = exchange_among(*tcp, group, kAgreeTag + step++, {static_cast<uint8_t>(ok)},
                               deadline, "collective: shared-memory setup");
    agreed.clear();
    for (const auto& row : rows)
      agreed.push_back(row.at(0));
    return agreed;
  };
  if (before_segments) before_segments(me, names);
  std::unique_ptr<ShmTransport> shm;
  try {
    shm = std::make_unique<ShmTransport>(me, static_cast<int>(group.size()), "pushpull", o, dir);
  } catch (const InvalidArgument&) {
    throw;  // a setting the ranks of a host disagree on: the user's to fix
  } catch (const Error& e) {
    const auto first_failed = std::find(agreed.begin(), agreed.end(), 0);
    if (agreed.empty() || first_failed == agreed.end()) throw;  // not a failure agreed on
    // One warning for the job: from the lowest rank whose own step failed,
    // with its reason; the others say it at INFO.
    if (first_failed - agreed.begin() == me)
      PP_WARN("{}; ranks {} exchange data over TCP instead of shared memory", e.what(),
              fmt::join(group, ","));
    else
      PP_INFO("collective: rank {} falls back to TCP with ranks {}: {}", rank,
              fmt::join(group, ","), e.what());
    // Every rank computed others_share as true (this group proved itself),
    // so this rank gives its direct streams up too (see above).
    auto alone = std::make_unique<ShmDataTransport>(std::move(tcp), nullptr, std::vector<int>{});
    alone->set_stream_below(stream_below);
    return alone;
  }
  PP_INFO("collective: rank {} moves data through shared memory with ranks {} ({} of {} ranks)",
          rank, fmt::join(group, ","), group.size(), size);
  auto both = std::make_unique<ShmDataTransport>(std::move(tcp), std::move(shm), std::move(group));
  both->set_stream_below(stream_below);
  return both;
}

}  // namespace pushpull::transport
