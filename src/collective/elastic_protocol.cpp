// SPDX-License-Identifier: Apache-2.0
#include "collective/elastic_protocol.h"

#include <fmt/format.h>

#include "collective/store.h"
#include "transport/wire.h"

namespace pushpull::collective::elastic {
namespace {

constexpr size_t kMaxMembers = 1 << 16;
constexpr size_t kMaxText = 4096;

Status malformed(const char* what) {
  return {ErrorCode::kProtocolError, fmt::format("elastic rendezvous: malformed {}", what)};
}

}  // namespace

std::vector<std::byte> encode(const JoinRequest& j) {
  transport::Writer w;
  w.str(j.worker_id).str(j.host).u<int32_t>(j.port);
  return w.take();
}

Status decode(const std::byte* data, size_t n, JoinRequest* out) {
  transport::Reader r({data, n});
  out->worker_id = r.str(256);
  out->host = r.str(256);
  out->port = r.u<int32_t>();
  if (!r.done() || out->worker_id.empty() || out->port <= 0 || out->port > 65535)
    return malformed("join request");
  return {};
}

std::vector<std::byte> encode(const Assignment& a) {
  // The book first into its own writer: writing the fixed fields into an
  // empty Writer here trips g++ 12's -Wstringop-overflow (a false positive).
  transport::Writer book;
  put_address_list(book, a.book);
  transport::Writer w;
  w.reserve(20 + book.size());
  w.u<uint64_t>(a.round).u<int32_t>(a.rank).u<uint64_t>(a.hosts_stamp).bytes(book.data());
  return w.take();
}

Status decode(const std::byte* data, size_t n, Assignment* out) {
  transport::Reader r({data, n});
  out->round = r.u<uint64_t>();
  out->rank = r.u<int32_t>();
  out->hosts_stamp = r.u<uint64_t>();
  if (!get_address_list(r, kMaxMembers, &out->book) || !r.done() || out->book.empty() ||
      out->rank < 0 || out->rank >= static_cast<int>(out->book.size()))
    return malformed("assignment");
  return {};
}

std::vector<std::byte> encode(const MemberGone& g) {
  transport::Writer w;
  w.u<uint64_t>(g.round).str(g.why.substr(0, kMaxText));
  return w.take();
}

Status decode(const std::byte* data, size_t n, MemberGone* out) {
  transport::Reader r({data, n});
  out->round = r.u<uint64_t>();
  out->why = r.str(kMaxText);
  return r.done() ? Status{} : malformed("member-gone notice");
}

std::vector<std::byte> encode_stamp(uint64_t stamp) {
  transport::Writer w;
  w.u<uint64_t>(stamp);
  return w.take();
}

Status decode_stamp(const std::byte* data, size_t n, uint64_t* stamp) {
  transport::Reader r({data, n});
  *stamp = r.u<uint64_t>();
  return r.done() ? Status{} : malformed("hosts notice");
}

std::string round_job_id(const std::string& job_id, uint64_t round) {
  return fmt::format("{}#elastic-round-{}", job_id, round);
}

}  // namespace pushpull::collective::elastic
