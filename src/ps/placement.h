// SPDX-License-Identifier: Apache-2.0
// Which server owns which part of which key (MXNet / ps-lite placement).
//
// A value with fewer elements than the big-array bound lives whole on one
// server: integer key k on server k mod S (consecutive keys round-robin), a
// string key on a server chosen by a hash of its id. A value with at least that many is cut
// into one contiguous slice per server (slice i of S: elements
// [i*n/S, (i+1)*n/S)), so its parts move to and from all servers in parallel.
// Every worker computes the same placement from (key id, element count,
// number of servers, bound): nothing is negotiated.
//
// String keys travel as a 64-bit id (FNV-1a of the name); the server keeps the
// name given at init and reports a collision instead of mixing two keys.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace pushpull::ps {

struct Slice {
  int server = 0;
  int64_t begin = 0;  // first element
  int64_t count = 0;  // elements
};

// The slices of a value of `numel` elements, in element order. Empty slices
// (more servers than elements) are left out; a 0-element value has one empty
// slice on its hash server so that push/pull still round-trip.
// With `weights` (one per server, ps/server_shares.h), slice i holds a share
// of a big value in proportion to weights[i] instead (a zero weight: no
// slice); small values stay whole on server_of's server.
std::vector<Slice> place(uint64_t key_id, int64_t numel, int num_servers, int64_t bigarray_bound,
                         const std::vector<double>& weights = {});

// Cuts every slice into chunks of at most `max_count` elements (in order), so
// one big value travels as several messages that the server can sum and
// answer while the rest is still arriving.
std::vector<Slice> chunk(const std::vector<Slice>& slices, int64_t max_count);

// Elements per chunk for a value placed as `slices`: small enough that the
// largest slice travels in at least `min_pieces` chunks, never below
// `min_count` nor above `max_count` (the configured chunk size). Why: a
// server answers a chunk once every worker's push of it arrived, so the
// push->reply pipeline fills and drains in about one chunk per connection;
// with k servers sharing a worker's link that costs k x chunk / bandwidth,
// which must stay a small share of the value's time (measured across
// shaped links: 4 MiB chunks made a 40 MiB push+pull over 4 servers take
// 1.5-1.7x its bound, 16 pieces per slice of at least 256 KiB 1.10x, 32
// of at least 128 KiB 1.07x; with mixed placement's ragged ends, 128 of
// at least 64 KiB took 1.09x where 32 took 1.11x, docs/scaling.md; on one
// host chunks only cost CPU: DistStore sends whole slices there).
int64_t chunk_count(const std::vector<Slice>& slices, int64_t max_count, int64_t min_count,
                    int min_pieces);

// The server of a small value.
int server_of(uint64_t key_id, int num_servers);

// 64-bit id of a string key (FNV-1a), with the top bit set so it never equals
// an integer key below 2^63.
uint64_t string_key_id(std::string_view name);

}  // namespace pushpull::ps
