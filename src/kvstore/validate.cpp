// SPDX-License-Identifier: Apache-2.0
#include "kvstore/validate.h"

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::kv {

void check_key_kinds(const char* op, const std::vector<Key>& keys, std::optional<bool> int_keys) {
  if (keys.empty())
    throw InvalidArgument(fmt::format("{}: the list of keys is empty; give at least one key", op));
  for (const Key& k : keys) {
    if (k.is_int() != keys.front().is_int())
      throw InvalidArgument(fmt::format(
          "{}: keys mix kinds (key {} is {}, key {} is {}); one store uses either int or string "
          "keys",
          op, keys.front().to_string(), keys.front().kind_name(), k.to_string(), k.kind_name()));
    if (int_keys && *int_keys != k.is_int())
      throw InvalidArgument(
          fmt::format("{}: key {} is {}, but this store holds {} keys; one store uses one kind", op,
                      k.to_string(), k.kind_name(), *int_keys ? "int" : "string"));
  }
}

void check_counts(const char* op, size_t keys, size_t lists, const char* what) {
  if (lists != keys)
    throw InvalidArgument(
        fmt::format("{}: {} keys but {} {}; give one per key", op, keys, lists, what));
}

void check_array(const char* op, std::string_view store, const Key& key, const ArrayView& a,
                 size_t i, size_t n, const char* what) {
  if (!a.device.is_cpu())
    throw InvalidArgument(fmt::format(
        "{} of key {}: {} {} of {} is on {}; arrays on {} are not supported yet by the '{}' "
        "store: copy it to the CPU",
        op, key.to_string(), what, i + 1, n, a.device.to_string(), a.device.to_string(), store));
  if (!a.data && a.nbytes() > 0)
    throw InvalidArgument(fmt::format("{} of key {}: {} {} of {} ({}) has no data (null pointer)",
                                      op, key.to_string(), what, i + 1, n, a.describe()));
}

void check_list(const char* op, std::string_view store, const Key& key, const Shape& shape,
                DType dtype, const ArrayList& arrays, const char* what) {
  if (arrays.empty())
    throw InvalidArgument(fmt::format(
        "{} of key {}: the list of {}s is empty; give one array per device (at least one)", op,
        key.to_string(), what));
  for (size_t i = 0; i < arrays.size(); ++i) {
    const ArrayView& a = arrays[i];
    check_array(op, store, key, a, i, arrays.size(), what);
    if (a.dtype != dtype || !(a.shape == shape))
      throw InvalidArgument(fmt::format(
          "{} of key {}: {} {} of {} is {}{} but the key holds {}{}; use arrays of the key's "
          "shape and dtype",
          op, key.to_string(), what, i + 1, arrays.size(), dtype_name(a.dtype), a.shape.to_string(),
          dtype_name(dtype), shape.to_string()));
  }
}

void check_init(std::string_view store, const std::vector<Key>& keys,
                const std::vector<ArrayView>& values, std::optional<bool> int_keys,
                const std::function<bool(const Key&)>& held) {
  check_key_kinds("init", keys, int_keys);
  check_counts("init", keys.size(), values.size(), "values");
  for (size_t i = 0; i < keys.size(); ++i) {
    check_array("init", store, keys[i], values[i], 0, 1, "value");
    bool again = held(keys[i]);
    for (size_t j = 0; j < i && !again; ++j)
      again = keys[j] == keys[i];
    if (again)
      throw AlreadyExists(fmt::format(
          "init: key {} is already initialised; a key is initialised once (push to change it)",
          keys[i].to_string()));
  }
}

void throw_not_initialised(const char* op, const Key& key) {
  throw NotFound(fmt::format("{}: key {} was never initialised; call init(key, value) first", op,
                             key.to_string()));
}

std::vector<int64_t> check_row_ids(const Key& key, const ArrayView& row_ids, int64_t rows) {
  if (!row_ids.device.is_cpu() || (!row_ids.data && row_ids.numel() > 0))
    throw InvalidArgument(
        fmt::format("row_sparse_pull of key {}: row_ids must be a CPU array", key.to_string()));
  if (row_ids.shape.ndim() != 1 ||
      (row_ids.dtype != DType::kInt64 && row_ids.dtype != DType::kInt32))
    throw InvalidArgument(
        fmt::format("row_sparse_pull of key {}: row_ids must be a 1-D int64 or int32 array, got {}",
                    key.to_string(), row_ids.describe()));
  std::vector<int64_t> ids(static_cast<size_t>(row_ids.numel()));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = row_ids.dtype == DType::kInt64 ? row_ids.as<int64_t>()[i] : row_ids.as<int32_t>()[i];
    if (ids[i] < 0 || ids[i] >= rows)
      throw InvalidArgument(
          fmt::format("row_sparse_pull of key {}: row id {} is outside the value's {} rows",
                      key.to_string(), ids[i], rows));
  }
  return ids;
}

}  // namespace pushpull::kv
