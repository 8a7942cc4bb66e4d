// SPDX-License-Identifier: Apache-2.0
// TrainerCore: construction, the hooks' pushes and step(). The flat buffers
// (init, results, the local update) are in trainer_core_buffers.cpp.
#include "pushpull/frontend/trainer_core.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "pushpull/error.h"
#include "pushpull/log.h"

namespace pushpull::frontend {

namespace {

std::vector<KeyUnit> units_for(const std::vector<Shape>& shapes, const TrainerCoreOptions& o) {
  std::vector<int64_t> numels;
  for (const auto& s : shapes)
    numels.push_back(s.numel());
  return pack_keys(numels, o.key_base, o.fuse_below, o.bucket_bytes, "Trainer");
}

std::vector<std::vector<size_t>> members_of(const std::vector<KeyUnit>& units) {
  std::vector<std::vector<size_t>> members;
  for (const auto& u : units)
    members.push_back(u.members);
  return members;
}

}  // namespace

TrainerCore::TrainerCore(std::function<KVStore&()> store, OptimizerSpec spec,
                         std::vector<Shape> shapes, int replicas, TrainerCoreOptions options,
                         TrainerTensors& tensors)
    : store_(std::move(store)),
      spec_(std::move(spec)),
      shapes_(std::move(shapes)),
      k_(replicas),
      opt_(options),
      tensors_(tensors),
      units_(units_for(shapes_, opt_)),
      schedule_(members_of(units_), shapes_.size(), replicas, opt_.push_from_hooks) {
  if (shapes_.empty()) throw InvalidArgument("Trainer: no parameters to train");
  const std::string& type = store_().type();
  // Python's Trainer refused every "async" type, the C++ one dist_async: both
  // mean the servers apply pushes as they come, so a local update would
  // apply other workers' stale gradients.
  if (!opt_.update_on_kvstore && type.find("async") != std::string::npos) {
    throw InvalidArgument(fmt::format(
        "Trainer: update_on_kvstore = false is not possible with a '{}' store (workers would "
        "apply each other's stale gradients); let the servers run the optimizer "
        "(update_on_kvstore = true), as in Gluon",
        type));
  }
  if (!(opt_.scale > 0))
    throw InvalidArgument(fmt::format("Trainer: scale must be > 0, got {}", opt_.scale));
  // Checks the spec now (InvalidArgument listing the valid names), even when
  // the store will run it.
  if (opt_.update_on_kvstore || opt_.local_optimizer) {
    auto checked = create_optimizer(spec_);
    if (!opt_.update_on_kvstore) local_ = std::move(checked);
  }
  unit_of_.assign(shapes_.size(), 0);
  buffers_.resize(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    const KeyUnit& unit = units_[u];
    Buffers& b = buffers_[u];
    for (size_t i : unit.members)
      unit_of_[i] = u;
    const auto numel = static_cast<size_t>(unit.numel);
    if (unit.packed()) {
      b.grads.assign(static_cast<size_t>(k_), std::vector<float>(numel));
      b.value.resize(numel);
      b.holds_result = true;
      if (local_) b.weight.resize(numel);
    } else if (!opt_.update_on_kvstore) {
      b.value.resize(numel);
      b.holds_result = true;
    }
  }
  handles_.resize(units_.size());
}

TrainerCore::~TrainerCore() {
  std::vector<KVHandle> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending = stale_;
    pending.insert(pending.end(), handles_.begin(), handles_.end());
  }
  try {
    tensors_.blocking([&] {
      for (const auto& h : pending) {
        try {
          store_().wait(h);
        } catch (const std::exception& e) {
          PP_DEBUG("Trainer: an exchange left at destruction failed: {}", e.what());
        }
      }
    });
  } catch (const std::exception& e) {  // the store is gone: its operations failed
    PP_DEBUG("Trainer: at destruction: {}", e.what());
  }
}

std::string TrainerCore::key_label(size_t i) const {
  const KeyUnit& u = units_[unit_of_.at(i)];
  return fmt::format("{}key {}", u.packed() ? "packed in " : "", u.key);
}

ArrayView TrainerCore::checked(const ArrayView& v, size_t i, const char* what) const {
  if (v.dtype != DType::kFloat32 || v.data == nullptr || v.numel() != shapes_[i].numel()) {
    throw InvalidArgument(
        fmt::format("Trainer: the {} of parameter {} ({}) is {}, expected {} "
                    "float32 elements",
                    what, i, key_label(i), v.describe(), shapes_[i].numel()));
  }
  return v;
}

ArrayList TrainerCore::outputs(size_t u) {
  Buffers& b = buffers_[u];
  const KeyUnit& unit = units_[u];
  if (b.holds_result) {
    const Shape s = unit.packed() ? Shape{unit.numel} : shapes_[unit.members[0]];
    return {ArrayView(b.value.data(), DType::kFloat32, s)};
  }
  ArrayList outs;
  for (int d = 0; d < k_; ++d)
    outs.push_back(checked(tensors_.weight(unit.members[0], d), unit.members[0], "weights"));
  return outs;
}

KVHandle TrainerCore::exchange(size_t u, const ArrayList& grads) {
  // One call: the store sends each slice's pull right behind its push, so a
  // server answers it as soon as the round is complete, while backward goes
  // on. Priority -i: the first layers are needed first by the next forward.
  ArrayList outs = outputs(u);
  KVHandle h;
  tensors_.blocking([&] {
    h = store_().pushpull_async({Key(units_[u].key)}, {grads}, {outs},
                                -static_cast<int>(units_[u].members[0]));
  });
  return h;
}

PushSchedule::Ready TrainerCore::grad_ready(size_t i) {
  const auto ready = schedule_.grad_ready(i);
  if (ready.what != PushSchedule::Ready::kPush) return ready.what;
  const size_t u = ready.unit;
  KVHandle h;
  try {
    h = exchange(u, gradients(u));
  } catch (...) {
    schedule_.push_failed(u);  // step() pushes it (and reports the problem)
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  handles_[u] = std::move(h);
  ++stats_.hook_pushes;
  return ready.what;
}

void TrainerCore::rescale(int64_t batch_size) {
  if (!opt_.update_on_kvstore) return;
  KVStore& kv = store_();
  const int workers = kv.num_workers();
  if (first_batch_ == 0) {
    // Once, as Gluon does: the store's optimizer turns summed gradients into
    // the mean over the global batch.
    OptimizerSpec scaled = spec_;
    auto it = scaled.hyperparameters.find("rescale_grad");
    const double user_scale = it == scaled.hyperparameters.end() ? 1.0 : it->second;
    scaled.hyperparameters["rescale_grad"] =
        user_scale * opt_.scale / static_cast<double>(batch_size * workers);
    tensors_.blocking([&] { kv.set_optimizer(scaled); });
    first_batch_ = batch_size;
  } else if (batch_size != first_batch_) {
    tensors_.batch_changed(batch_size, first_batch_, workers);
  }
}

void TrainerCore::step(int64_t batch_size) {
  if (batch_size <= 0) {
    throw InvalidArgument(fmt::format("Trainer.step: batch_size must be > 0, got {}", batch_size));
  }
  schedule_.disarm();  // no hook may push while step() runs
  // Whatever happens below, the next round starts clean; an exchange that
  // may still run is kept (in_flight(), the destructor).
  struct RoundReset {
    TrainerCore* self;
    ~RoundReset() {
      std::lock_guard<std::mutex> lock(self->mu_);
      auto& stale = self->stale_;
      stale.erase(
          std::remove_if(stale.begin(), stale.end(), [](const KVHandle& h) { return h.done(); }),
          stale.end());
      for (auto& h : self->handles_) {
        if (!h.done()) stale.push_back(h);
        h = KVHandle();
      }
      self->schedule_.end_round();
    }
  } reset{this};
  init();
  rescale(batch_size);

  const size_t m = units_.size();
  // Check every gradient before pushing any, so a bad one changes nothing.
  std::vector<ArrayList> lists(m);
  for (size_t u = 0; u < m; ++u) {
    if (!schedule_.pushed(u)) lists[u] = gradients(u);
  }
  for (size_t u = 0; u < m; ++u) {
    if (schedule_.pushed(u)) continue;
    KVHandle h = exchange(u, lists[u]);
    std::lock_guard<std::mutex> lock(mu_);
    handles_[u] = std::move(h);
    ++stats_.step_pushes;
  }
  std::vector<KVHandle> exchanges;
  {
    std::lock_guard<std::mutex> lock(mu_);
    exchanges = handles_;
  }
  const int64_t global_batch = batch_size * store_().num_workers();
  double waited = 0;
  for (size_t u = 0; u < m; ++u) {
    const auto t0 = std::chrono::steady_clock::now();
    tensors_.blocking([&] { store_().wait(exchanges[u]); });
    waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    finish(u, global_batch);
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.wait_seconds += waited;
  ++stats_.steps;
}

TrainerCore::Stats TrainerCore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool TrainerCore::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto running = [](const KVHandle& h) { return !h.done(); };
  return std::any_of(stale_.begin(), stale_.end(), running) ||
         std::any_of(handles_.begin(), handles_.end(), running);
}

}  // namespace pushpull::frontend
