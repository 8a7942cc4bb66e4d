// SPDX-License-Identifier: Apache-2.0
// The IDX decoder behind read_idx (pushpull/data/idx.h), on bytes already
// read: what the fuzz target (tests/fuzz/fuzz_data_idx.cpp) exercises.
//
// The bytes are untrusted: every dimension product is overflow-checked and
// every read is checked against the bytes present. Errors: InvalidArgument
// naming `source` and what is wrong. Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "pushpull/data/idx.h"

namespace pushpull::data {

IdxArray decode_idx(std::span<const uint8_t> bytes, std::string_view source);

}  // namespace pushpull::data
