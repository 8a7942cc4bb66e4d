// SPDX-License-Identifier: Apache-2.0
// Argument checks shared by every KVStore type, so each rejects the same bad
// input with the same message before anything changes.
//
// Thread safety: pure functions (they throw InvalidArgument / NotFound).
#pragma once

#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "pushpull/kvstore.h"

namespace pushpull::kv {

// A non-empty list of keys of one kind, matching the store's kind if known.
void check_key_kinds(const char* op, const std::vector<Key>& keys, std::optional<bool> int_keys);
// As many lists (or values) as keys.
void check_counts(const char* op, size_t keys, size_t lists, const char* what = "lists of arrays");
// One caller array: on the CPU, with data. `i` of `n` for the message.
void check_array(const char* op, std::string_view store, const Key& key, const ArrayView& a,
                 size_t i, size_t n, const char* what);
// A non-empty list of CPU arrays of the key's shape and dtype.
void check_list(const char* op, std::string_view store, const Key& key, const Shape& shape,
                DType dtype, const ArrayList& arrays, const char* what);
// Everything init() checks: key kinds, one value per key, CPU arrays with
// data, and no key initialised twice (already held: `held(key)` is true, or
// repeated in `keys`) → AlreadyExists.
void check_init(std::string_view store, const std::vector<Key>& keys,
                const std::vector<ArrayView>& values, std::optional<bool> int_keys,
                const std::function<bool(const Key&)>& held);
// NotFound for a key that was never initialised.
[[noreturn]] void throw_not_initialised(const char* op, const Key& key);
// Row ids for row_sparse_pull: a 1-D int32/int64 CPU array whose ids are
// within [0, rows). Returns them as int64.
std::vector<int64_t> check_row_ids(const Key& key, const ArrayView& row_ids, int64_t rows);

}  // namespace pushpull::kv
