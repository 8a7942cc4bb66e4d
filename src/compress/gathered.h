// SPDX-License-Identifier: Apache-2.0
// The sum of every rank's encoded gradient after an allgather: how the
// collectives (dist_sync_allreduce, `bench allreduce`) use 1bit and 2bit.
// Quantised codes cannot be added on the way round a ring, so each rank
// encodes its gradient with its own residual (error feedback), the encoded
// bytes are allgathered, and every rank decodes and adds all of them itself.
//
// The sum is taken in rank order, ((0 + d_0) + d_1) + ... + d_{n-1}, one
// cache-sized block of values at a time through every rank's codes, so every
// rank that holds the same gathered bytes gets the same bits (float addition
// is not associative: the order is the contract).
//
// Why an allgather and not a compressed reduce-scatter + allgather (BytePS,
// 1-bit Adam): a rank sends (n-1) C bytes here against 2 (n-1)/n C there (C:
// one rank's codes), i.e. n/2 times more (measured: `bench allreduce
// --compression 1bit,1bit_rs` is 2x faster at n = 4), but every worker's
// codes are summed exactly, as dist_sync's servers sum them (no second
// quantisation of the sum, one residual), and nothing new runs in the
// engine. Against float32's ring (2 (n-1)/n 4N bytes) it still sends 64/n
// (1bit) and 32/n (2bit) times fewer bytes: ahead below 64 and 32 ranks
// (docs/collectives.md "Gradient compression").
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <span>

#include "compress/codec.h"
#include "pushpull/error.h"

namespace pushpull::compress {

// out[0, n) = the rank-order sum of the n values each of parts[r] encodes
// (raw codes, codec.compressed_bytes(n) bytes each; the caller checked the
// lengths). With no parts, out is zeroed.
void sum_in_rank_order(const Codec& codec, std::span<const std::byte* const> parts, size_t n,
                       float* out);

// The same over an allgather's output: `gathered` holds `ranks` wire forms
// (compressor.h: header + codes) of n values, back to back. Every header must
// carry `mine` (InvalidArgument naming the rank and both settings: workers
// set different compression) and the length must be exactly ranks *
// (kHeaderBytes + compressed_bytes(n)) (ProtocolError); out is untouched on
// an error.
Status sum_gathered(const Settings& mine, std::span<const std::byte> gathered, int ranks, size_t n,
                    float* out);

}  // namespace pushpull::compress
