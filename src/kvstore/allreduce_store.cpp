// SPDX-License-Identifier: Apache-2.0
#include "kvstore/allreduce_store.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "compress/gathered.h"
#include "kvstore/validate.h"
#include "pushpull/error.h"
#include "pushpull/kernels.h"
#include "pushpull/log.h"

namespace pushpull {
namespace {

int engine_threads(int configured) {
  if (configured > 0) return configured;
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 4);
}

// The dtype the workers reduce in: float32 for 16-bit values.
DType wire_dtype(DType dt) {
  return is_half(dt) ? DType::kFloat32 : dt;
}

}  // namespace

AllreduceStore::AllreduceStore(std::string type, const Options& options)
    : KVStore(options.kvstore.wait_timeout),
      type_(std::move(type)),
      session_(std::make_unique<collective::Session>(options)),
      comm_(&session_->communicator()),
      exec_(engine_threads(options.kvstore.engine_threads), "pp-kv-allreduce") {
  PP_DEBUG("{} worker {} of {} ready (bootstrap {})", type_, rank(), num_workers(),
           session_->mode());
}

AllreduceStore::AllreduceStore(std::string type, const Options& options,
                               std::unique_ptr<collective::Communicator> comm)
    : KVStore(options.kvstore.wait_timeout),
      type_(std::move(type)),
      own_comm_(std::move(comm)),
      comm_(own_comm_.get()),
      exec_(engine_threads(options.kvstore.engine_threads), "pp-kv-allreduce") {
  if (!comm_) throw InvalidArgument(fmt::format("'{}' store: no communicator given", type_));
}

AllreduceStore::AllreduceStore(std::string type, const Options& options,
                               collective::elastic::CommunicatorFn follow)
    : KVStore(options.kvstore.wait_timeout),
      type_(std::move(type)),
      follow_(std::move(follow)),
      exec_(engine_threads(options.kvstore.engine_threads), "pp-kv-allreduce") {
  if (!follow_) throw InvalidArgument(fmt::format("'{}' store: no communicator given", type_));
  comm_ = &follow_();
}

collective::Communicator& AllreduceStore::comm() const {
  if (!comm_)
    throw PeerFailure(fmt::format(
        "'{}' store: the group failed and this store has not been re-bound to a new one", type_));
  return *comm_;
}

AllreduceStore::~AllreduceStore() {
  try {
    wait_all();
  } catch (const std::exception& e) {
    PP_WARN("{} store closing after an error: {}", type_, e.what());
  }
  // The applies still queued (after an error) fail fast once the
  // communicator is shut; the executor drains before the entries go. A
  // borrowed communicator is its owner's to shut.
  if (comm_ && !follow_) comm_->shutdown();
}

std::vector<AllreduceStore::Entry*> AllreduceStore::entries_for(const char* op,
                                                                const std::vector<Key>& keys,
                                                                size_t lists) const {
  std::shared_lock lock(mu_);
  kv::check_key_kinds(op, keys, int_keys_);
  kv::check_counts(op, keys.size(), lists);
  std::vector<Entry*> out;
  for (const Key& k : keys) {
    auto it = entries_.find(k);
    if (it == entries_.end()) kv::throw_not_initialised(op, k);
    out.push_back(it->second.get());
  }
  return out;
}

void AllreduceStore::init(const std::vector<Key>& keys, const std::vector<ArrayView>& values) {
  {
    std::shared_lock lock(mu_);
    kv::check_init(type_, keys, values, int_keys_,
                   [&](const Key& k) { return entries_.count(k) != 0; });
  }
  // Worker 0's values reach everyone; every worker's copy takes them.
  collective::Communicator& c = comm();
  std::vector<std::unique_ptr<Entry>> made;
  std::vector<collective::Handle> handles;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto e = std::make_unique<Entry>();
    e->key = keys[i];
    e->name = "kv." + keys[i].to_string();
    e->value = Array::copy_of(values[i]);
    e->shard = mix_hash(keys[i].hash());
    e->id = next_id_++;
    handles.push_back(c.broadcast_async(e->name + ".init", e->value.view(), 0));
    made.push_back(std::move(e));
  }
  for (const auto& h : handles)
    c.wait(h, wait_timeout());
  if (follow_)  // elastic: a failure before the first commit goes back to these
    for (auto& e : made)
      e->saved = Array::copy_of(e->value.view());
  std::unique_lock lock(mu_);
  for (auto& e : made) {
    Key k = e->key;
    entries_.emplace(std::move(k), std::move(e));
  }
  int_keys_ = keys.front().is_int();
}

void AllreduceStore::copy_out(const Entry& e, const ArrayList& outs) {
  const size_t n = static_cast<size_t>(e.value.numel());
  if (n == 0) return;
  for (const ArrayView& o : outs)
    copy(e.value.dtype(), o.data, e.value.data(), n);
}

void AllreduceStore::push_key(Entry& e, const ArrayList& values, const ArrayList* outs,
                              std::shared_ptr<const Apply> apply,
                              std::shared_ptr<compress::Compressor> compressor,
                              const std::shared_ptr<Completion>& done) {
  std::lock_guard lock(e.submit_mu);
  const uint64_t seq = e.pushes;
  const size_t slot = static_cast<size_t>(seq % kSlots);
  if (e.busy[slot]) {  // the push kSlots earlier must be applied before its buffer is reused
    Status s = e.busy[slot]->wait_for(wait_timeout());
    if (s.code() == ErrorCode::kTimeout) s.raise();
  }
  const DType dt = e.value.dtype(), wire = wire_dtype(dt);
  const size_t n = static_cast<size_t>(e.value.numel());
  if (!is_floating(dt)) compressor.reset();  // integer keys travel as they are
  Array& g = e.grad[slot];
  if (g.empty() || g.dtype() != wire || !(g.shape() == e.value.shape()))
    g = Array(e.value.shape(), wire);
  if (n) {
    convert(wire, g.data(), dt, values[0].data, n);
    if (values.size() > 1) {
      Array tmp = wire == dt ? Array() : Array(e.value.shape(), wire);
      for (size_t d = 1; d < values.size(); ++d) {
        if (wire == dt) {
          reduce_sum(dt, g.data(), values[d].data, n);
        } else {
          convert(wire, tmp.data(), dt, values[d].data, n);
          reduce_sum(wire, g.data(), tmp.data(), n);
        }
      }
    }
  }
  ArrayView on_the_ring = g.view();
  // 1bit/2bit: codes cannot be summed on the way round a ring; they are
  // allgathered and every worker sums them (compress/gathered.h).
  const bool gather = compressor && compressor->settings().quantises();
  if (compressor) {
    std::vector<float> g32;
    const float* f32 = g.as<float>();
    if (wire != DType::kFloat32 && n) {
      g32.resize(n);
      convert(DType::kFloat32, g32.data(), wire, g.data(), n);
      f32 = g32.data();
    }
    const int device = values[0].device.id;
    if (gather) {
      Array& b = e.codes[slot];
      const auto bytes = static_cast<int64_t>(compressor->encoded_bytes(n));
      if (b.empty() || b.numel() != bytes) b = Array(Shape{bytes}, DType::kUInt8);
      compressor->encode(e.id, device, n, 0, f32, n, static_cast<std::byte*>(b.data()));
      on_the_ring = b.view();
    } else {  // fp16 (a ring can sum it): half the bytes on the wire
      Array& h = e.half[slot];
      if (h.empty() || !(h.shape() == e.value.shape())) h = Array(e.value.shape(), DType::kFloat16);
      if (n) compressor->encode_raw(e.id, device, n, 0, f32, n, static_cast<std::byte*>(h.data()));
      on_the_ring = h.view();
    }
  }
  // The apply keeps the communicator it was submitted on: an elastic
  // re-formation re-binds comm_ only after every apply has run.
  collective::Communicator* c = &comm();
  const std::string name = fmt::format("{}#{}", e.name, slot);
  collective::Handle h = gather
                             ? c->allgather_async(name, on_the_ring)
                             : c->allreduce_async(name, on_the_ring, collective::Reduction::kSum);
  ++e.pushes;
  auto mine = std::make_shared<Completion>(1);
  e.busy[slot] = mine;
  std::optional<ArrayList> pull_to;
  if (outs) pull_to = *outs;
  Entry* ep = &e;
  const bool decode = compressor != nullptr;
  const compress::Settings settings = compressor ? compressor->settings() : compress::Settings{};
  exec_.submit(
      e.shard,
      [this, c, ep, h, slot, mine, decode, gather, settings, apply = std::move(apply),
       pull_to = std::move(pull_to)] {
        try {
          Array& g = ep->grad[slot];
          const size_t count = static_cast<size_t>(g.numel());
          if (gather) {
            sum_codes(*c, c->take_output(h, wait_timeout()), settings, g);
          } else {
            c->wait(h, wait_timeout());
            if (decode && count)  // the float16 sum back into the reduce dtype
              convert(g.dtype(), g.data(), DType::kFloat16, ep->half[slot].data(), count);
          }
          kv::apply_update(apply.get(), ep->key, g.view(), ep->value.view(), ep->rounded);
          if (pull_to) copy_out(*ep, *pull_to);
          mine->finish();
        } catch (...) {
          mine->finish(Status::from_current_exception());
          throw;
        }
      },
      done);
}

void AllreduceStore::sum_codes(const collective::Communicator& c, const Array& gathered,
                               const compress::Settings& settings, Array& g) {
  const size_t count = static_cast<size_t>(g.numel());
  std::vector<float> f32(g.dtype() == DType::kFloat32 ? 0 : count);
  float* out = f32.empty() ? g.as<float>() : f32.data();
  const std::span<const std::byte> bytes(static_cast<const std::byte*>(gathered.data()),
                                         gathered.nbytes());
  compress::sum_gathered(settings, bytes, c.size(), count, out).raise();
  if (!f32.empty() && count) convert(g.dtype(), g.data(), DType::kFloat32, out, count);
}

KVHandle AllreduceStore::push_async(const std::vector<Key>& keys,
                                    const std::vector<ArrayList>& values, int priority) {
  return pushpull_async(keys, values, {}, priority);
}

KVHandle AllreduceStore::pushpull_async(const std::vector<Key>& keys,
                                        const std::vector<ArrayList>& values,
                                        const std::vector<ArrayList>& outs, int /*priority*/) {
  const char* op = outs.empty() ? "push" : "pushpull";
  std::vector<Entry*> es = entries_for(op, keys, values.size());
  if (!outs.empty()) kv::check_counts(op, keys.size(), outs.size(), "lists of outputs");
  for (size_t i = 0; i < es.size(); ++i) {
    const ArrayView held = es[i]->value.view();
    kv::check_list(op, type_, es[i]->key, held.shape, held.dtype, values[i], "value");
    if (!outs.empty())
      kv::check_list(op, type_, es[i]->key, held.shape, held.dtype, outs[i], "output");
  }
  std::shared_ptr<const Apply> apply;
  std::shared_ptr<compress::Compressor> compressor;
  {
    std::shared_lock lock(mu_);
    apply = rule_.get();
    compressor = compressor_;
  }
  auto done = std::make_shared<Completion>(static_cast<int>(es.size()));
  for (size_t i = 0; i < es.size(); ++i) {
    try {
      push_key(*es[i], values[i], outs.empty() ? nullptr : &outs[i], apply, compressor, done);
    } catch (...) {
      // Keys already submitted complete on their own; this and later ones fail.
      Status s = Status::from_current_exception();
      for (size_t j = i; j < es.size(); ++j)
        done->finish(s);
      break;
    }
  }
  return KVHandle(std::move(done));
}

KVHandle AllreduceStore::pull_async(const std::vector<Key>& keys,
                                    const std::vector<ArrayList>& outs, int /*priority*/) {
  std::vector<Entry*> es = entries_for("pull", keys, outs.size());
  for (size_t i = 0; i < es.size(); ++i) {
    const ArrayView held = es[i]->value.view();
    kv::check_list("pull", type_, es[i]->key, held.shape, held.dtype, outs[i], "output");
  }
  auto done = std::make_shared<Completion>(static_cast<int>(es.size()));
  for (size_t i = 0; i < es.size(); ++i) {
    Entry* e = es[i];
    exec_.submit(
        e->shard, [e, o = outs[i]] { copy_out(*e, o); }, done);
  }
  return KVHandle(std::move(done));
}

KVHandle AllreduceStore::row_sparse_pull_async(const Key& key, const ArrayList& outs,
                                               const ArrayView& row_ids, int /*priority*/) {
  const char* op = "row_sparse_pull";
  Entry* e = entries_for(op, {key}, 1).front();
  const Shape& shape = e->value.shape();
  if (shape.ndim() < 1)
    throw InvalidArgument(fmt::format("{} of key {}: the value {} has no rows", op, key.to_string(),
                                      shape.to_string()));
  kv::check_list(op, type_, key, shape, e->value.dtype(), outs, "output");
  std::vector<int64_t> ids = kv::check_row_ids(key, row_ids, shape[0]);
  auto done = std::make_shared<Completion>(1);
  exec_.submit(
      e->shard,
      [e, outs, ids = std::move(ids)] {
        const int64_t rows = e->value.shape()[0];
        const size_t row_bytes = rows ? e->value.nbytes() / static_cast<size_t>(rows) : 0;
        const auto* src = static_cast<const std::byte*>(e->value.data());
        for (const ArrayView& o : outs) {
          auto* dst = static_cast<std::byte*>(o.data);
          if (o.nbytes()) std::memset(dst, 0, o.nbytes());  // rows not asked for are zero
          for (int64_t r : ids)
            if (row_bytes)
              std::memcpy(dst + static_cast<size_t>(r) * row_bytes,
                          src + static_cast<size_t>(r) * row_bytes, row_bytes);
        }
      },
      done);
  return KVHandle(std::move(done));
}

void AllreduceStore::wait_all() {
  exec_.wait_idle(wait_timeout());
}

void AllreduceStore::barrier() {
  wait_all();
  comm().barrier();
}

void AllreduceStore::set_updater(Updater updater) {
  rule_.set_updater(std::move(updater));
}

void AllreduceStore::set_optimizer(const OptimizerSpec& spec) {
  rule_.set_optimizer(spec);
}

void AllreduceStore::save_optimizer_states(const std::string& path) {
  auto opt = rule_.optimizer("save_optimizer_states");
  exec_.run_exclusive([&] { opt->save_states_to_file(path); }, wait_timeout());
}

void AllreduceStore::load_optimizer_states(const std::string& path) {
  auto opt = rule_.optimizer("load_optimizer_states");
  exec_.run_exclusive([&] { opt->load_states_from_file(path); }, wait_timeout());
}

void AllreduceStore::set_gradient_compression(const std::map<std::string, std::string>& params) {
  const compress::Settings settings = compress::parse_settings(params);  // the one parser
  auto compressor = settings.enabled() ? std::make_shared<compress::Compressor>(settings) : nullptr;
  std::unique_lock lock(mu_);
  compressor_ = std::move(compressor);  // new settings start from zero residuals
}

}  // namespace pushpull
