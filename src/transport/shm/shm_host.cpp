// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/shm_host.h"

#include <cstring>

#include <fmt/format.h>

#include "pushpull/error.h"
#include "transport/hello.h"

namespace pushpull::transport {
namespace {

constexpr transport::ShmKind kProbeKind{"pushpull-probe-", 32};
constexpr transport::ProofForm kProbeForm{kProbeKind, 16, 16, 0};  // the probe is its content

}  // namespace

std::vector<uint8_t> encode(const RankRecord& r) {
  std::vector<uint8_t> out(kRankRecordBytes);
  std::memcpy(out.data(), transport::encode(r.host).data(), transport::kHostRecordBytes);
  std::memcpy(out.data() + transport::kHostRecordBytes, r.token.data(), r.token.size());
  return out;
}

RankRecord decode_rank_record(const uint8_t* data, size_t bytes) {
  RankRecord r;
  const auto* in = reinterpret_cast<const std::byte*>(data);
  Status st = bytes == kRankRecordBytes
                  ? transport::decode({in, transport::kHostRecordBytes}, &r.host)
                  : Status{ErrorCode::kProtocolError, "wrong size"};
  if (!st)
    throw ProtocolError(
        fmt::format("collective: a rank's record of {} bytes: {}", bytes, st.message()));
  std::memcpy(r.token.data(), data + transport::kHostRecordBytes, r.token.size());
  return r;
}

HostProbe::HostProbe(const std::string& dir) : dir_(dir) {
  if (Status st = transport::ShmFile::create(dir, kProbeKind, kProbeForm.max_bytes,
                                             transport::ShmMapping{.writable = true}, &probe_);
      !st)
    throw IoError(
        fmt::format("collective shm: cannot create a probe in {}: {}", dir, st.message()));
  record_.host = transport::prove(dir, *probe_, kProbeForm);
  const transport::Nonce token = transport::random_nonce();
  std::memcpy(record_.token.data(), token.data(), record_.token.size());
}

HostProbe::~HostProbe() = default;

bool HostProbe::reserve(size_t bytes) {
  // A file of its own, held until remove(): the probe keeps the exact size
  // its peers check.
  return probe_ && transport::ShmFile::create(dir_, kProbeKind, bytes,
                                              transport::ShmMapping{.writable = true}, &reserved_)
                       .is_ok();
}

void HostProbe::remove() {
  probe_.reset();
  reserved_.reset();
}

bool HostProbe::sees(const RankRecord& peer) const {
  std::unique_ptr<transport::ShmFile> f;
  return transport::verify(dir_, peer.host, kProbeForm, transport::ShmMapping{}, &f).is_ok();
}

int sweep_stale_files(const std::string& dir) {
  return transport::ShmFile::sweep_stale(dir, kProbeKind, transport::kShmStaleAfter) +
         transport::ShmFile::sweep_stale(dir, transport::ShmKind{"pushpull-coll-", 32},
                                         transport::kShmStaleAfter);
}

std::vector<int> same_key(const std::vector<RankRecord>& records, int rank) {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(records.size()); ++r)
    if (records[static_cast<size_t>(r)].host.key == records[static_cast<size_t>(rank)].host.key)
      out.push_back(r);
  return out;
}

std::vector<int> shm_group(const std::vector<RankRecord>& records,
                           const std::vector<std::vector<uint8_t>>& proof, int rank) {
  std::vector<int> g = same_key(records, rank);
  if (g.size() < 2) return {};
  for (int i : g)
    for (int j : g) {
      const auto& row = proof.at(static_cast<size_t>(i));
      if (static_cast<size_t>(j) >= row.size() || !row[static_cast<size_t>(j)]) return {};
    }
  return g;
}

}  // namespace pushpull::transport
