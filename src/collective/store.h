// SPDX-License-Identifier: Apache-2.0
// Store: where the ranks of a group meet (the shape of Gloo's
// rendezvous::Store: set, get, wait), and the one key protocol by which a
// group forms over any Store (exchange_book; bootstrap.h turns its book into
// the mesh, liveness and shared memory with connect_group).
//
// Stores: the MASTER_ADDR store rank 0 hosts (tcp_store.h) and torch's c10d
// store (integrations/torch/process_group/meet.cpp). The scheduler's address
// book and an elastic round arrive complete and need no store.
//
// Key protocol: every rank r > 0 sets "rank/<r>" to its entry {world size,
// host and port of its mesh listener}; rank 0 waits for them all (bounded by
// the startup deadline), checks them, and sets "book" to its verdict: every
// rank's address, or the error every rank then raises (a rank missing:
// Timeout naming it; another world size: InvalidArgument; a rank that died
// during the meeting: PeerFailure naming it). Rank 0 is the one judge, so
// every rank fails with the same reason, at once.
//
// Thread safety: a Store is used by one thread at a time (its owner's);
// implementations may run their own threads. Ownership: the caller owns the
// Store; exchange_book() only uses it.
#pragma once

#include <chrono>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/options.h"
#include "transport/wire.h"

namespace pushpull::collective {

using Clock = std::chrono::steady_clock;

class Store {
 public:
  virtual ~Store() = default;
  // Sets `key` once. Setting the bytes it already holds is a no-op; other
  // bytes are an InvalidArgument (the MASTER_ADDR store is write-once: a
  // second writer of a rank's key is a rank twice). PeerFailure when the
  // store's host is gone.
  virtual void set(const std::string& key, std::vector<std::byte> value) = 0;
  // The value of `key`, once set. Timeout naming the key at `deadline`;
  // PeerFailure when the store's host is gone (on the host: when a member
  // left while it still waited for a key, i.e. it died).
  virtual std::vector<std::byte> get(const std::string& key, Clock::time_point deadline) = 0;
  // Waits until every key is set or `deadline` passes and returns the keys
  // still missing then (empty: all set), so that the caller names what they
  // mean (ranks) in its Timeout. PeerFailure as get().
  virtual std::vector<std::string> wait(const std::vector<std::string>& keys,
                                        Clock::time_point deadline) = 0;
  // Where the store is, for messages ("10.0.0.1:29500", "the c10d store").
  virtual std::string where() const = 0;
};

// Every rank's (host, port) of the collective mesh, by rank.
using AddressList = std::vector<std::pair<std::string, int>>;

// Meets the group through `store` as `rank` of `size`, whose mesh listens at
// (host, port); returns every rank's address. Blocks until rank 0's verdict
// (rank 0: until every rank's entry), at most until `deadline` (the others
// give rank 0's verdict 2 s more: it names the missing ranks). Throws the
// verdict's error (see above), or the store's.
AddressList exchange_book(Store& store, int rank, int size, const std::string& host, int port,
                          Clock::time_point deadline);

// Wire forms, all bounds-checked (tests/fuzz/fuzz_rendezvous.cpp).
// An address list (rank 0's book, an elastic round's): its hosts as a table
// (transport/host_table.h), then (host index, u16 port) per rank; ports 1..65535.
// get_address_list() reads at most `max_ranks` entries and fails on anything
// malformed or not canonical.
void put_address_list(transport::Writer& w, const AddressList& book);
bool get_address_list(transport::Reader& r, size_t max_ranks, AddressList* book);
// A rank's entry ("rank/<r>"): u32 world size, host, u16 port.
std::vector<std::byte> encode_entry(int size, const std::string& host, int port);
Status decode_entry(std::span<const std::byte> in, int* size, std::string* host, int* port);
// Rank 0's verdict ("book"): u32 error code, then the address list (code 0)
// or the reason. decode_verdict() returns the decoding's failure, else sets
// `*verdict` to the verdict (ok: `*book` is filled).
std::vector<std::byte> encode_verdict(const Status& verdict, const AddressList& book);
Status decode_verdict(std::span<const std::byte> in, Status* verdict, AddressList* book);

}  // namespace pushpull::collective
