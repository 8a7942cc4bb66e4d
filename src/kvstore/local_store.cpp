// SPDX-License-Identifier: Apache-2.0
#include "kvstore/local_store.h"

#include "compress/settings.h"
#include "kvstore/validate.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "pushpull/error.h"
#include "pushpull/kernels.h"
#include "pushpull/log.h"

namespace pushpull {
namespace {

int engine_threads(int configured) {
  if (configured > 0) return configured;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, 4);
}

void ensure(Array& a, const Shape& shape, DType dtype) {
  if (a.empty() || a.dtype() != dtype || !(a.shape() == shape)) a = Array(shape, dtype);
}

}  // namespace

LocalStore::Entry::Entry(Key k, const ArrayView& v)
    : key(std::move(k)), value(Array::copy_of(v)), shard(mix_hash(key.hash())) {}

LocalStore::LocalStore(std::string type, const Options& options)
    : KVStore(options.kvstore.wait_timeout),
      type_(std::move(type)),
      exec_(engine_threads(options.kvstore.engine_threads), "pp-kvstore") {}

// exec_ is destroyed first and runs what is queued, while entries still exist.
LocalStore::~LocalStore() = default;

std::vector<LocalStore::Entry*> LocalStore::entries_for(const char* op,
                                                        const std::vector<Key>& keys,
                                                        size_t lists) const {
  kv::check_key_kinds(op, keys, int_keys_);
  kv::check_counts(op, keys.size(), lists);
  std::vector<Entry*> es;
  es.reserve(keys.size());
  for (const Key& k : keys) {
    auto it = entries_.find(k);
    if (it == entries_.end()) kv::throw_not_initialised(op, k);
    es.push_back(it->second.get());
  }
  return es;
}

void LocalStore::init(const std::vector<Key>& keys, const std::vector<ArrayView>& values) {
  std::unique_lock lock(mu_);
  kv::check_init(type_, keys, values, int_keys_,
                 [&](const Key& k) { return entries_.count(k) != 0; });
  // Copies first, so an allocation failure leaves the store unchanged.
  std::vector<std::unique_ptr<Entry>> made;
  for (size_t i = 0; i < keys.size(); ++i)
    made.push_back(std::make_unique<Entry>(keys[i], values[i]));
  for (auto& e : made) {
    Key k = e->key;
    entries_.emplace(std::move(k), std::move(e));
  }
  int_keys_ = keys.front().is_int();
}

KVHandle LocalStore::push_async(const std::vector<Key>& keys, const std::vector<ArrayList>& values,
                                int /*priority: call order decides*/) {
  std::vector<Entry*> es;
  std::shared_ptr<const Apply> apply;
  {
    std::shared_lock lock(mu_);
    es = entries_for("push", keys, values.size());
    apply = rule_.get();
  }
  for (size_t i = 0; i < es.size(); ++i)
    kv::check_list("push", type_, es[i]->key, es[i]->value.shape(), es[i]->value.dtype(), values[i],
                   "value");
  auto done = std::make_shared<Completion>(static_cast<int>(es.size()));
  for (size_t i = 0; i < es.size(); ++i) {
    Entry* e = es[i];
    exec_.submit(
        e->shard, [this, e, vals = values[i], apply] { do_push(*e, vals, apply.get()); }, done);
  }
  return KVHandle(std::move(done));
}

KVHandle LocalStore::pull_async(const std::vector<Key>& keys, const std::vector<ArrayList>& outs,
                                int /*priority*/) {
  std::vector<Entry*> es;
  {
    std::shared_lock lock(mu_);
    es = entries_for("pull", keys, outs.size());
  }
  for (size_t i = 0; i < es.size(); ++i)
    kv::check_list("pull", type_, es[i]->key, es[i]->value.shape(), es[i]->value.dtype(), outs[i],
                   "output");
  auto done = std::make_shared<Completion>(static_cast<int>(es.size()));
  for (size_t i = 0; i < es.size(); ++i) {
    Entry* e = es[i];
    exec_.submit(
        e->shard, [this, e, o = outs[i]] { do_pull(*e, o); }, done);
  }
  return KVHandle(std::move(done));
}

KVHandle LocalStore::pushpull_async(const std::vector<Key>& keys,
                                    const std::vector<ArrayList>& values,
                                    const std::vector<ArrayList>& outs, int /*priority*/) {
  std::vector<Entry*> es;
  std::shared_ptr<const Apply> apply;
  {
    std::shared_lock lock(mu_);
    es = entries_for("pushpull", keys, values.size());
    apply = rule_.get();
  }
  if (outs.size() != keys.size())
    throw InvalidArgument(
        fmt::format("pushpull: {} keys but {} lists of outputs", keys.size(), outs.size()));
  for (size_t i = 0; i < es.size(); ++i) {
    kv::check_list("pushpull", type_, es[i]->key, es[i]->value.shape(), es[i]->value.dtype(),
                   values[i], "value");
    kv::check_list("pushpull", type_, es[i]->key, es[i]->value.shape(), es[i]->value.dtype(),
                   outs[i], "output");
  }
  auto done = std::make_shared<Completion>(static_cast<int>(es.size()));
  for (size_t i = 0; i < es.size(); ++i) {
    Entry* e = es[i];
    exec_.submit(
        e->shard,
        [this, e, vals = values[i], o = outs[i], apply] {
          do_push(*e, vals, apply.get());
          do_pull(*e, o);
        },
        done);
  }
  return KVHandle(std::move(done));
}

KVHandle LocalStore::row_sparse_pull_async(const Key& key, const ArrayList& outs,
                                           const ArrayView& row_ids, int /*priority*/) {
  const char* op = "row_sparse_pull";
  Entry* e;
  {
    std::shared_lock lock(mu_);
    e = entries_for(op, {key}, 1).front();
  }
  const Shape& held = e->value.shape();
  if (held.ndim() < 1)
    throw InvalidArgument(fmt::format("{} of key {}: the value {} has no rows", op, key.to_string(),
                                      held.to_string()));
  kv::check_list(op, type_, key, held, e->value.dtype(), outs, "output");
  std::vector<int64_t> rows = kv::check_row_ids(key, row_ids, held[0]);
  auto done = std::make_shared<Completion>(1);
  exec_.submit(
      e->shard,
      [e, outs, rows = std::move(rows)] {
        // MXNet's meaning: the listed rows get the value's rows, the others are zero.
        const size_t row_bytes =
            e->value.shape()[0] ? e->value.nbytes() / static_cast<size_t>(e->value.shape()[0]) : 0;
        const char* src = static_cast<const char*>(e->value.data());
        for (const ArrayView& o : outs) {
          std::memset(o.data, 0, o.nbytes());
          for (int64_t r : rows)
            std::memcpy(static_cast<char*>(o.data) + static_cast<size_t>(r) * row_bytes,
                        src + static_cast<size_t>(r) * row_bytes, row_bytes);
        }
      },
      done);
  return KVHandle(std::move(done));
}

void LocalStore::do_push(Entry& e, const ArrayList& vals, const Apply* apply) {
  const DType dt = e.value.dtype();
  const Shape& shape = e.value.shape();
  const size_t n = static_cast<size_t>(e.value.numel());
  if (n == 0) return;
  const bool half = is_half(dt);
  const bool has_apply = apply && (apply->updater || apply->optimizer);

  if (!has_apply && !half) {  // sum straight into the stored value
    copy(dt, e.value.data(), vals[0].data, n);
    for (size_t i = 1; i < vals.size(); ++i)
      reduce_sum(dt, e.value.data(), vals[i].data, n);
    return;
  }
  // The sum of the pushed arrays; 16-bit values are summed in float32.
  ArrayView summed = vals[0];
  if (vals.size() > 1) {
    if (!half) {
      ensure(e.sum, shape, dt);
      copy(dt, e.sum.data(), vals[0].data, n);
      for (size_t i = 1; i < vals.size(); ++i)
        reduce_sum(dt, e.sum.data(), vals[i].data, n);
      summed = e.sum.view();
    } else {
      ensure(e.sum32, shape, DType::kFloat32);
      ensure(e.tmp32, shape, DType::kFloat32);
      convert(DType::kFloat32, e.sum32.data(), dt, vals[0].data, n);
      for (size_t i = 1; i < vals.size(); ++i) {
        convert(DType::kFloat32, e.tmp32.data(), dt, vals[i].data, n);
        reduce_sum(DType::kFloat32, e.sum32.data(), e.tmp32.data(), n);
      }
      summed = e.sum32.view();
    }
  }
  kv::apply_update(apply, e.key, summed, e.value.view(), e.sum);
}

void LocalStore::do_pull(Entry& e, const ArrayList& outs) {
  const size_t n = static_cast<size_t>(e.value.numel());
  if (n == 0) return;
  for (const ArrayView& o : outs)
    copy(e.value.dtype(), o.data, e.value.data(), n);
}

void LocalStore::wait_all() {
  exec_.wait_idle(wait_timeout());
}

void LocalStore::set_updater(Updater updater) {
  rule_.set_updater(std::move(updater));
}

void LocalStore::set_optimizer(const OptimizerSpec& spec) {
  rule_.set_optimizer(spec);
}

void LocalStore::save_optimizer_states(const std::string& path) {
  auto opt = rule_.optimizer("save_optimizer_states");
  // Pauses the workers: states are saved after every earlier push, and no
  // update runs while they are read.
  exec_.run_exclusive([&] { opt->save_states_to_file(path); }, wait_timeout());
}

void LocalStore::load_optimizer_states(const std::string& path) {
  auto opt = rule_.optimizer("load_optimizer_states");
  exec_.run_exclusive([&] { opt->load_states_from_file(path); }, wait_timeout());
}

void LocalStore::set_gradient_compression(const std::map<std::string, std::string>& params) {
  const compress::Settings settings = compress::parse_settings(params);  // the one parser
  if (settings.enabled())
    throw InvalidArgument(fmt::format(
        "gradient compression '{}' on a '{}' store: nothing leaves this process, so there is "
        "nothing to compress; use a distributed store (dist_sync, dist_async, "
        "dist_sync_allreduce), or type 'none'",
        settings.to_string(), type_));
}

}  // namespace pushpull
