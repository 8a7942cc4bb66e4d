// SPDX-License-Identifier: Apache-2.0
// The key protocol of store.h (exchange_book) and its wire forms.
#include "collective/store.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pushpull/log.h"
#include "transport/host_table.h"

namespace pushpull::collective {

namespace {

constexpr uint32_t kMaxRanks = 1 << 20;
constexpr size_t kMaxHostBytes = 1024;  // a host name or address in a book
constexpr size_t kMaxReasonBytes = 1 << 16;
constexpr const char* kBookKey = "book";

std::string rank_key(int rank) {
  return fmt::format("rank/{}", rank);
}

Status malformed(const char* what) {
  return {ErrorCode::kProtocolError, fmt::format("collective rendezvous: malformed {}", what)};
}

// Rank 0: every entry, checked, into the book. Throws what it finds wrong.
AddressList judge(Store& store, int size, const std::string& host, int port,
                  Clock::time_point deadline, Millis waited) {
  std::vector<std::string> keys;
  for (int r = 1; r < size; ++r)
    keys.push_back(rank_key(r));
  std::vector<std::string> missing = store.wait(keys, deadline);
  if (!missing.empty()) {
    std::vector<std::string> ranks;
    for (const auto& k : missing)
      ranks.push_back(k.substr(k.find('/') + 1));
    throw Timeout(
        fmt::format("collective rendezvous: rank 0 waited {} ms at {} for ranks {}; "
                    "check that they started with the same MASTER_ADDR/MASTER_PORT "
                    "and can reach it",
                    waited.count(), store.where(), fmt::join(ranks, ", ")));
  }
  AddressList book{{host, port}};
  for (int r = 1; r < size; ++r) {
    int their_size = 0, their_port = 0;
    std::string their_host;
    decode_entry(store.get(rank_key(r), deadline), &their_size, &their_host, &their_port).raise();
    if (their_size != size)
      throw InvalidArgument(
          fmt::format("collective rendezvous: rank {} says the world has {} "
                      "ranks, rank 0 says {}; give every process the same "
                      "WORLD_SIZE",
                      r, their_size, size));
    book.emplace_back(std::move(their_host), their_port);
  }
  return book;
}

}  // namespace

AddressList exchange_book(Store& store, int rank, int size, const std::string& host, int port,
                          Clock::time_point deadline) {
  if (size < 1 || rank < 0 || rank >= size)
    throw InvalidArgument(fmt::format("collective rendezvous: rank {} of size {}", rank, size));
  if (size == 1) return {{host, port}};
  const auto waited = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  PP_DEBUG("collective rendezvous: rank {} of {} at {}", rank, size, store.where());
  if (rank == 0) {
    AddressList book;
    Status verdict;
    try {
      book = judge(store, size, host, port, deadline, waited);
    } catch (const std::exception&) {
      verdict = Status::from_current_exception();
    }
    // Tell the others at once instead of leaving them to their deadline.
    try {
      store.set(kBookKey, encode_verdict(verdict, book));
    } catch (const std::exception& e) {
      if (verdict.is_ok()) throw;
      PP_DEBUG("collective rendezvous: could not tell the others: {}", e.what());
    }
    verdict.raise();
    return book;
  }
  store.set(rank_key(rank), encode_entry(size, host, port));
  // Rank 0 has the same deadline and the better verdict (which ranks are
  // missing): give it a moment to arrive.
  std::vector<std::byte> bytes = store.get(kBookKey, deadline + Millis(2000));
  Status verdict;
  AddressList book;
  decode_verdict(bytes, &verdict, &book).raise();
  if (!verdict.is_ok())
    throw_error(
        verdict.code() == ErrorCode::kInvalidArgument || verdict.code() == ErrorCode::kTimeout
            ? verdict.code()
            : ErrorCode::kPeerFailure,
        fmt::format("rank 0 ended the rendezvous: {}", verdict.message()));
  if (static_cast<int>(book.size()) != size)
    throw ProtocolError(fmt::format("collective rendezvous: rank 0 sent {} addresses for {} ranks",
                                    book.size(), size));
  return book;
}

void put_address_list(transport::Writer& w, const AddressList& book) {
  std::vector<std::string_view> hosts;
  hosts.reserve(book.size());
  for (const auto& [h, p] : book)
    hosts.push_back(h);
  const std::vector<uint32_t> at = transport::put_host_table(w, hosts);
  w.u<uint32_t>(static_cast<uint32_t>(book.size()));
  for (size_t i = 0; i < book.size(); ++i)
    w.u<uint32_t>(at[i]).u<uint16_t>(static_cast<uint16_t>(book[i].second));
}

bool get_address_list(transport::Reader& r, size_t max_ranks, AddressList* book) {
  transport::HostTableReader hosts;
  if (!hosts.read(r, max_ranks, kMaxHostBytes)) return false;
  const size_t count = r.count(max_ranks, 6);
  if (!r.ok()) return false;
  book->clear();
  book->reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const std::string* host = hosts.take(r.u<uint32_t>());
    const int port = r.u<uint16_t>();
    if (!r.ok() || host == nullptr || port == 0) return false;
    book->emplace_back(*host, port);
  }
  return hosts.complete();
}

std::vector<std::byte> encode_entry(int size, const std::string& host, int port) {
  transport::Writer w;
  w.reserve(10 + host.size());
  w.u<uint32_t>(static_cast<uint32_t>(size)).str(host).u<uint16_t>(static_cast<uint16_t>(port));
  return w.take();
}

Status decode_entry(std::span<const std::byte> in, int* size, std::string* host, int* port) {
  transport::Reader r(in);
  const uint32_t s = r.u<uint32_t>();
  *host = r.str(kMaxHostBytes);
  *port = r.u<uint16_t>();
  *size = static_cast<int>(std::min(s, kMaxRanks + 1));
  return r.ok() && r.at_end() && *port != 0 ? Status{} : malformed("rank's entry");
}

std::vector<std::byte> encode_verdict(const Status& verdict, const AddressList& book) {
  transport::Writer w;
  w.reserve(64);
  w.u<uint32_t>(static_cast<uint32_t>(verdict.code()));
  if (verdict.is_ok())
    put_address_list(w, book);
  else
    w.str(verdict.message().substr(0, kMaxReasonBytes));
  return w.take();
}

Status decode_verdict(std::span<const std::byte> in, Status* verdict, AddressList* book) {
  transport::Reader r(in);
  const uint32_t code = r.u<uint32_t>();
  if (!r.ok() || code > static_cast<uint32_t>(ErrorCode::kInternal)) return malformed("verdict");
  if (code == 0) {
    *verdict = Status{};
    return get_address_list(r, kMaxRanks, book) && r.at_end() ? Status{} : malformed("verdict");
  }
  std::string why = r.str(kMaxReasonBytes);
  if (!r.ok() || !r.at_end()) return malformed("verdict");
  *verdict = Status(static_cast<ErrorCode>(code), std::move(why));
  return {};
}

}  // namespace pushpull::collective
