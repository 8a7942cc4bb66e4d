// SPDX-License-Identifier: Apache-2.0
// TrainerCore's flat buffers: gradients in, init, results out, the local
// update (include/pushpull/frontend/trainer_core.h).
#include <fmt/format.h>

#include <cstring>

#include "pushpull/error.h"
#include "pushpull/frontend/trainer_core.h"

namespace pushpull::frontend {

namespace {

ArrayView flat_view(std::vector<float>& v) {
  return ArrayView(v.data(), DType::kFloat32, Shape{static_cast<int64_t>(v.size())});
}

}  // namespace

ArrayList TrainerCore::gradients(size_t u) {
  const KeyUnit& unit = units_[u];
  ArrayList list;
  list.reserve(static_cast<size_t>(k_));
  if (!unit.packed()) {
    for (int d = 0; d < k_; ++d)
      list.push_back(checked(tensors_.gradient(unit.members[0], d), unit.members[0], "gradient"));
    return list;
  }
  // Every one checked before any is copied.
  std::vector<ArrayView> grads;
  for (int d = 0; d < k_; ++d) {
    for (size_t i : unit.members)
      grads.push_back(checked(tensors_.gradient(i, d), i, "gradient"));
  }
  Buffers& b = buffers_[u];
  const size_t n = unit.members.size();
  for (int d = 0; d < k_; ++d) {
    auto& flat = b.grads[static_cast<size_t>(d)];
    for (size_t j = 0; j < n; ++j) {
      const ArrayView& g = grads[static_cast<size_t>(d) * n + j];
      std::memcpy(flat.data() + unit.offsets[j], g.data, g.nbytes());
    }
    list.push_back(flat_view(flat));
  }
  return list;
}

void TrainerCore::gather(size_t u, int d, float* flat) {
  const KeyUnit& unit = units_[u];
  for (size_t j = 0; j < unit.members.size(); ++j) {
    const size_t i = unit.members[j];
    const ArrayView w = checked(tensors_.weight(i, d), i, "weights");
    std::memcpy(flat + unit.offsets[j], w.data, w.nbytes());
  }
}

void TrainerCore::scatter(size_t u, const float* flat, int d) {
  const KeyUnit& unit = units_[u];
  for (size_t j = 0; j < unit.members.size(); ++j) {
    const size_t i = unit.members[j];
    const ArrayView w = checked(tensors_.weight(i, d), i, "weights");
    std::memcpy(w.data, flat + unit.offsets[j], w.nbytes());
  }
}

void TrainerCore::init() {
  if (initialised_) return;
  std::vector<Key> keys;
  std::vector<ArrayView> values;
  std::vector<ArrayList> outs;
  for (size_t u = 0; u < units_.size(); ++u) {
    const KeyUnit& unit = units_[u];
    keys.push_back(Key(unit.key));
    if (unit.packed()) {
      auto& flat = buffers_[u].value;
      gather(u, 0, flat.data());
      values.push_back(flat_view(flat));
      outs.push_back({flat_view(flat)});
    } else {
      const size_t i = unit.members[0];
      values.push_back(checked(tensors_.weight(i, 0), i, "weights"));
      ArrayList all;
      for (int d = 0; d < k_; ++d)
        all.push_back(checked(tensors_.weight(i, d), i, "weights"));
      outs.push_back(std::move(all));
    }
  }
  // The store keeps rank 0's values: every replica of every worker starts there.
  tensors_.blocking([&] {
    KVStore& kv = store_();
    kv.init(keys, values);
    kv.pull(keys, outs);
  });
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].packed()) continue;
    for (int d = 0; d < k_; ++d)
      scatter(u, buffers_[u].value.data(), d);
  }
  initialised_ = true;
}

void TrainerCore::finish(size_t u, int64_t global_batch) {
  if (!opt_.update_on_kvstore) {
    local_update(u, global_batch);
  } else if (units_[u].packed()) {
    for (int d = 0; d < k_; ++d)
      scatter(u, buffers_[u].value.data(), d);
  }
}

void TrainerCore::local_update(size_t u, int64_t global_batch) {
  const KeyUnit& unit = units_[u];
  Buffers& b = buffers_[u];
  // rescale before the optimizer (which applies its own rescale_grad too), so
  // the batch size may change between steps. In float, as torch's mul_ does.
  const auto scale = static_cast<float>(1.0 / static_cast<double>(global_batch));
  for (float& g : b.value)
    g *= scale;
  if (!local_) return;  // the framework's optimizer reads summed()
  const Shape& shape = unit.packed() ? Shape{unit.numel} : shapes_[unit.members[0]];
  const ArrayView grad(b.value.data(), DType::kFloat32, shape);
  if (unit.packed()) {
    gather(u, 0, b.weight.data());
    local_->update(Key(unit.key), flat_view(b.weight), grad);
    for (int d = 0; d < k_; ++d)
      scatter(u, b.weight.data(), d);
    return;
  }
  const size_t i = unit.members[0];
  const ArrayView w0 = checked(tensors_.weight(i, 0), i, "weights");
  local_->update(Key(unit.key), w0, grad);
  for (int d = 1; d < k_; ++d) {
    const ArrayView w = checked(tensors_.weight(i, d), i, "weights");
    std::memcpy(w.data, w0.data, w0.nbytes());
  }
}

ArrayView TrainerCore::summed(size_t i) const {
  const size_t u = unit_of_.at(i);
  const KeyUnit& unit = units_[u];
  const Buffers& b = buffers_[u];
  if (opt_.update_on_kvstore) {
    throw InvalidArgument("Trainer: the summed gradients stay on the store with update_on_kvstore");
  }
  size_t at = 0;
  for (size_t j = 0; j < unit.members.size(); ++j)
    if (unit.members[j] == i) at = static_cast<size_t>(unit.offsets[j]);
  return ArrayView(const_cast<float*>(b.value.data()) + at, DType::kFloat32, shapes_[i]);
}

}  // namespace pushpull::frontend
