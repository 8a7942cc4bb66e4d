// create_kvstore: one line per type name. The distributed types add their own
// lines here (dist_sync, dist_async, dist_device_sync, dist_sync_allreduce).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvstore/local_store.h"
#include "pushpull/error.h"
#include "pushpull/kvstore.h"

namespace pushpull {
namespace {

using Maker = std::unique_ptr<KVStore> (*)(std::string_view type, const Options& options);

std::unique_ptr<KVStore> make_local(std::string_view type, const Options& options) {
  return std::make_unique<LocalStore>(std::string(type), options);
}

struct TypeEntry {
  std::string_view name;
  Maker make;
};

// Arrays live on the CPU today, so "device" (sum on the arrays' device) and
// its alias run the same code as "local".
constexpr TypeEntry kTypes[] = {
    {"local", make_local},
    {"local_update_cpu", make_local},
    {"local_allreduce_cpu", make_local},
    {"device", make_local},
    {"local_allreduce_device", make_local},
};

}  // namespace

std::vector<std::string> kvstore_types() {
  std::vector<std::string> names;
  for (const auto& t : kTypes)
    names.emplace_back(t.name);
  return names;
}

std::unique_ptr<KVStore> create_kvstore(std::string_view type, const Options& options) {
  for (const auto& t : kTypes)
    if (t.name == type) return t.make(type, options);
  throw InvalidArgument(
      fmt::format("unknown kvstore type '{}'; valid: {}", type, fmt::join(kvstore_types(), ", ")));
}

}  // namespace pushpull
