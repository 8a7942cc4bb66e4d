#include "ps/server_store.h"

#include <condition_variable>
#include <cstring>
#include <deque>

#include <fmt/format.h>

#include "compress/two_bit.h"
#include "pushpull/kernels.h"
#include "pushpull/log.h"

namespace pushpull::ps {

struct HeldPush {
  RequestMeta meta;
  Payload grad;
  bool compressed;
};

struct ServerStore::Entry {
  std::string name;
  Array value;
  Array merged;  // the round's sum: float32 for 16-bit values, else the value's dtype
  DType merged_dtype = DType::kFloat32;
  int pushed_this_round = 0;
  std::vector<char> pushed;               // per worker: pushed in the open round
  std::vector<int64_t> received;          // per worker: pushes received
  std::vector<int64_t> applied;           // per worker: pushes applied
  std::deque<HeldPush> held;              // pushes for the next round
  std::vector<RequestMeta> round_pushes;  // acknowledged when the round is applied
  struct WaitingPull {
    RequestMeta meta;
    std::vector<Range> ranges;
    int64_t needs_applied;
  };
  std::vector<WaitingPull> waiting;
};

ServerStore::ServerStore(ServerStoreConfig config, ServerResponder& responder)
    : config_(config),
      responder_(responder),
      executor_(std::max(1, config.threads), fmt::format("pp-server{}", config.server_rank)) {}

ServerStore::~ServerStore() = default;

ServerStore::Entry* ServerStore::find(uint64_t key) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second.get();
}

std::shared_ptr<Optimizer> ServerStore::optimizer() const {
  std::lock_guard lock(mu_);
  return optimizer_;
}

void ServerStore::fail(const RequestMeta& m, const Status& s) {
  responder_.reply(m, s, DType::kFloat32, {});
}

void ServerStore::init(const RequestMeta& m, uint64_t key, std::string name, Payload value) {
  executor_.submit(mix_hash(key), [this, m, key, name = std::move(name), value]() mutable {
    {
      std::lock_guard lock(mu_);
      auto it = entries_.find(key);
      if (it != entries_.end()) {
        std::string what = it->second->name == name
                               ? fmt::format("key {} is already initialised", name)
                               : fmt::format("keys {} and {} have the same id {}; rename one",
                                             it->second->name, name, key);
        responder_.reply(m, Status(ErrorCode::kAlreadyExists, what), DType::kFloat32, {});
        return;
      }
      auto e = std::make_unique<Entry>();
      e->name = name;
      e->value = Array::copy_of(value.view);
      e->merged_dtype = is_half(value.view.dtype) ? DType::kFloat32 : value.view.dtype;
      e->pushed.assign(config_.num_workers, 0);
      e->received.assign(config_.num_workers, 0);
      e->applied.assign(config_.num_workers, 0);
      entries_.emplace(key, std::move(e));
    }
    responder_.reply(m, Status::ok(), DType::kFloat32, {});
  });
}

void ServerStore::push(const RequestMeta& m, uint64_t key, Payload grad, bool compressed) {
  executor_.submit(mix_hash(key), [this, m, key, grad = std::move(grad), compressed] {
    Entry* e = find(key);
    if (!e)
      return fail(m, Status(ErrorCode::kNotFound,
                            fmt::format("push to key id {} that was never initialised", key)));
    if (m.worker < 0 || m.worker >= config_.num_workers)
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("push from unknown worker {}", m.worker)));
    const ArrayView& v = e->value.view();
    if (!compressed && (grad.view.dtype != v.dtype || grad.view.numel() != v.numel()))
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("push to key {}: got {}, the key holds {}", e->name,
                                        grad.view.describe(), v.describe())));
    if (!config_.sync) {
      if (!optimizer())
        return fail(m, Status(ErrorCode::kInvalidArgument,
                              fmt::format("dist_async push to key {} before set_optimizer: an "
                                          "asynchronous store needs an optimizer on the servers",
                                          e->name)));
      try {
        apply_push(*e, grad, compressed);
        e->pushed_this_round = config_.num_workers;  // a round of one push
        e->round_pushes.push_back(m);
        e->received[m.worker]++;
        apply_round(key, *e);
      } catch (...) {
        fail(m, Status::from_current_exception());
      }
      return;
    }
    e->received[m.worker]++;
    if (e->pushed[m.worker]) {  // this worker is a round ahead: hold it
      e->held.push_back({m, grad, compressed});
      return;
    }
    try {
      apply_push(*e, grad, compressed);
    } catch (...) {
      e->received[m.worker]--;
      return fail(m, Status::from_current_exception());
    }
    e->pushed[m.worker] = 1;
    e->round_pushes.push_back(m);
    if (++e->pushed_this_round == config_.num_workers) apply_round(key, *e);
  });
}

// Adds one worker's push into the round's merge buffer.
void ServerStore::apply_push(Entry& e, const Payload& grad, bool compressed) {
  const ArrayView& v = e.value.view();
  size_t n = static_cast<size_t>(v.numel());
  bool first = e.pushed_this_round == 0 || !config_.sync;
  if (e.merged.empty()) e.merged = Array(v.shape, e.merged_dtype);
  if (compressed) {
    size_t need = 4 + compress::TwoBitCodec::compressed_bytes(n);
    if (grad.view.nbytes() != need)
      throw InvalidArgument(fmt::format("compressed push to key {} has {} bytes, expected {}",
                                        e.name, grad.view.nbytes(), need));
    float threshold;
    std::memcpy(&threshold, grad.view.data, 4);
    compress::TwoBitCodec codec(threshold);
    if (e.merged_dtype != DType::kFloat32)
      throw InvalidArgument(fmt::format("2bit compression needs a floating-point key; {} holds {}",
                                        e.name, dtype_name(v.dtype)));
    auto* words =
        reinterpret_cast<const uint32_t*>(static_cast<const std::byte*>(grad.view.data) + 4);
    if (first) std::memset(e.merged.data(), 0, e.merged.nbytes());
    codec.decompress_add(words, e.merged.as<float>(), n);
    return;
  }
  if (first) {
    convert(e.merged_dtype, e.merged.data(), v.dtype, grad.view.data, n);
  } else if (e.merged_dtype == v.dtype) {
    reduce_sum(v.dtype, e.merged.data(), grad.view.data, n);
  } else {  // 16-bit push into the float32 sum, in blocks on the stack
    constexpr size_t kBlock = 4096;
    alignas(64) float tmp[kBlock];
    for (size_t i = 0; i < n; i += kBlock) {
      size_t k = std::min(kBlock, n - i);
      convert(DType::kFloat32, tmp, v.dtype,
              static_cast<const std::byte*>(grad.view.data) + i * dtype_size(v.dtype), k);
      reduce_sum(DType::kFloat32, e.merged.as<float>() + i, tmp, k);
    }
  }
}

void ServerStore::apply_round(uint64_t key, Entry& e) {
  Status status;
  try {
    const ArrayView& v = e.value.view();
    size_t n = static_cast<size_t>(v.numel());
    if (auto opt = optimizer()) {
      opt->update(Key(static_cast<int64_t>(key)), v, e.merged.view());
    } else {
      convert(v.dtype, v.data, e.merged_dtype, e.merged.data(), n);
    }
  } catch (...) {
    status = Status::from_current_exception();
    PP_ERROR("update of key {} failed: {}", e.name, status.to_string());
  }
  for (const RequestMeta& m : e.round_pushes) {
    e.applied[m.worker]++;
    responder_.reply(m, status, DType::kFloat32, {});
  }
  e.round_pushes.clear();
  std::fill(e.pushed.begin(), e.pushed.end(), 0);
  e.pushed_this_round = 0;
  answer_ready_pulls(e);
  // Held pushes open the next round, in arrival order (per worker FIFO).
  std::deque<HeldPush> held = std::move(e.held);
  e.held.clear();
  while (!held.empty()) {
    HeldPush h = std::move(held.front());
    held.pop_front();
    if (e.pushed[h.meta.worker]) {
      e.held.push_back(std::move(h));
      continue;
    }
    try {
      apply_push(e, h.grad, h.compressed);
    } catch (...) {
      e.received[h.meta.worker]--;
      fail(h.meta, Status::from_current_exception());
      continue;
    }
    e.pushed[h.meta.worker] = 1;
    e.round_pushes.push_back(h.meta);
    if (++e.pushed_this_round == config_.num_workers) {
      for (auto& rest : held)
        e.held.push_back(std::move(rest));
      return apply_round(key, e);
    }
  }
}

void ServerStore::answer_ready_pulls(Entry& e) {
  auto waiting = std::move(e.waiting);
  e.waiting.clear();
  for (auto& w : waiting) {
    if (e.applied[w.meta.worker] >= w.needs_applied) {
      answer_pull(e, w.meta, w.ranges);
    } else {
      e.waiting.push_back(std::move(w));
    }
  }
}

void ServerStore::answer_pull(Entry& e, const RequestMeta& m, const std::vector<Range>& ranges) {
  const ArrayView& v = e.value.view();
  size_t esize = dtype_size(v.dtype);
  auto* base = static_cast<const std::byte*>(v.data);
  if (ranges.empty()) {
    responder_.reply(m, Status::ok(), v.dtype, {base, v.nbytes()});
    return;
  }
  std::vector<std::byte> gathered;
  for (const Range& r : ranges) {
    if (r.begin < 0 || r.count < 0 || r.begin + r.count > v.numel())
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("pull of key {}: range [{}, {}) is outside its {} elements",
                                        e.name, r.begin, r.begin + r.count, v.numel())));
    gathered.insert(gathered.end(), base + r.begin * esize, base + (r.begin + r.count) * esize);
  }
  responder_.reply(m, Status::ok(), v.dtype, gathered);
}

void ServerStore::pull(const RequestMeta& m, uint64_t key, std::vector<Range> ranges) {
  executor_.submit(mix_hash(key), [this, m, key, ranges = std::move(ranges)] {
    Entry* e = find(key);
    if (!e)
      return fail(m, Status(ErrorCode::kNotFound,
                            fmt::format("pull of key id {} that was never initialised", key)));
    if (m.worker < 0 || m.worker >= config_.num_workers)
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("pull from unknown worker {}", m.worker)));
    if (e->applied[m.worker] < e->received[m.worker]) {
      e->waiting.push_back({m, ranges, e->received[m.worker]});
      return;
    }
    answer_pull(*e, m, ranges);
  });
}

void ServerStore::on_all_threads(std::function<void()> fn) {
  // Every thread stops at a shared latch; the last to arrive runs fn while the
  // others wait, so fn sees all earlier work and no later work overtakes it.
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    bool done = false;
  };
  auto gate = std::make_shared<Gate>();
  int threads = executor_.num_threads();
  for (int t = 0; t < threads; ++t) {
    executor_.submit(static_cast<uint64_t>(t), [gate, threads, fn] {
      std::unique_lock lock(gate->mu);
      if (++gate->arrived == threads) {
        fn();
        gate->done = true;
        gate->cv.notify_all();
      } else {
        gate->cv.wait(lock, [&] { return gate->done; });
      }
    });
  }
}

void ServerStore::set_optimizer(const RequestMeta& m, const OptimizerSpec& spec) {
  std::shared_ptr<Optimizer> opt;
  try {
    opt = create_optimizer(spec);
  } catch (...) {
    return fail(m, Status::from_current_exception());
  }
  on_all_threads([this, m, opt] {
    {
      std::lock_guard lock(mu_);
      optimizer_ = opt;
    }
    responder_.reply(m, Status::ok(), DType::kUInt8, {});
  });
}

void ServerStore::save_states(const RequestMeta& m) {
  on_all_threads([this, m] {
    auto opt = optimizer();
    if (!opt)
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            "save_optimizer_states: no optimizer is set on the servers"));
    std::string bytes = opt->save_states();
    responder_.reply(m, Status::ok(), DType::kUInt8,
                     {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()});
  });
}

void ServerStore::load_states(const RequestMeta& m, std::string bytes) {
  on_all_threads([this, m, bytes = std::move(bytes)] {
    auto opt = optimizer();
    if (!opt)
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            "load_optimizer_states: set the optimizer before loading its states"));
    try {
      opt->load_states(bytes, fmt::format("server {}", config_.server_rank));
    } catch (...) {
      return fail(m, Status::from_current_exception());
    }
    responder_.reply(m, Status::ok(), DType::kUInt8, {});
  });
}

}  // namespace pushpull::ps
