// SPDX-License-Identifier: Apache-2.0
// Trainer's store keys (trainer.h, "Keys"): small parameters packed into flat
// keys, gradients checked and copied in, results copied back, init and the
// local update.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "pushpull/error.h"
#include "pushpull/frontend/key_packing.h"
#include "trainer_impl.h"

namespace pushpull::torch {

using namespace trainer_detail;

void Trainer::Impl::make_units() {
  unit_of.assign(n, 0);
  std::vector<int64_t> numels;
  for (const auto& p : replicas[0])
    numels.push_back(p.numel());
  // The keys (packing and assignment): frontend/key_packing.h, as the Python Trainer's.
  for (auto& k_unit : frontend::pack_keys(numels, opt.key_base, opt.fuse_below, opt.bucket_bytes)) {
    Unit u;
    u.key = Key(k_unit.key);
    u.members = std::move(k_unit.members);
    const auto cpu_float = at::TensorOptions().dtype(at::kFloat);
    if (u.packed()) {
      u.offsets = std::move(k_unit.offsets);
      for (int d = 0; d < k; ++d)
        u.grads.push_back(at::empty({k_unit.numel}, cpu_float));
      u.value = at::empty({k_unit.numel}, cpu_float);
      if (!opt.update_on_kvstore) u.weight = at::empty({k_unit.numel}, cpu_float);
    } else if (!opt.update_on_kvstore) {
      u.value = at::empty_like(replicas[0][u.members[0]].detach());
    }
    for (size_t i : u.members)
      unit_of[i] = units.size();
    units.push_back(std::move(u));
  }
}

std::string Trainer::Impl::key_label(size_t i) const {
  if (units.empty())  // before make_units: parameter i's own key
    return "key " + std::to_string(opt.key_base + static_cast<int64_t>(i));
  const Unit& u = units[unit_of[i]];
  return (u.packed() ? "packed in key " : "key ") + u.key.to_string();
}

const at::Tensor& Trainer::Impl::checked_gradient(size_t i, int d) const {
  const at::Tensor& p = replicas[static_cast<size_t>(d)][i];
  const at::Tensor& g = p.grad();
  if (!g.defined()) {
    throw InvalidArgument("Trainer::step: " + where(i, key_label(i), d) + " (" + describe(p) +
                          ") has no gradient; was it used in the forward pass, and did "
                          "backward() run on every replica before step()?");
  }
  if (auto problem = layout_problem(g); !problem.empty()) {
    throw InvalidArgument("Trainer: the gradient of " + where(i, key_label(i), d) + ", " +
                          describe(g) + ", " + problem);
  }
  if (g.sizes() != p.sizes()) {
    throw InvalidArgument("Trainer: the gradient of " + where(i, key_label(i), d) + " is " +
                          describe(g) + " but the parameter is " + describe(p));
  }
  return g;
}

ArrayList Trainer::Impl::gradients(size_t u) {
  Unit& unit = units[u];
  ArrayList list;
  list.reserve(static_cast<size_t>(k));
  if (!unit.packed()) {
    for (int d = 0; d < k; ++d)
      list.push_back(view_of(checked_gradient(unit.members[0], d)));
    return list;
  }
  for (int d = 0; d < k; ++d) {  // every one checked before any is copied
    for (size_t i : unit.members)
      checked_gradient(i, d);
  }
  for (int d = 0; d < k; ++d) {
    auto* flat = static_cast<char*>(unit.grads[static_cast<size_t>(d)].data_ptr());
    for (size_t j = 0; j < unit.members.size(); ++j) {
      const at::Tensor& g = replicas[static_cast<size_t>(d)][unit.members[j]].grad();
      std::memcpy(flat + unit.offsets[j] * sizeof(float), g.data_ptr(), g.nbytes());
    }
    list.push_back(view_of(unit.grads[static_cast<size_t>(d)]));
  }
  return list;
}

void Trainer::Impl::gather(const Unit& u, int d, const at::Tensor& flat) const {
  auto* dst = static_cast<char*>(flat.data_ptr());
  for (size_t j = 0; j < u.members.size(); ++j) {
    const at::Tensor& p = replicas[static_cast<size_t>(d)][u.members[j]];
    std::memcpy(dst + u.offsets[j] * sizeof(float), p.data_ptr(), p.nbytes());
  }
}

void Trainer::Impl::scatter(const Unit& u, const at::Tensor& flat, int d) {
  const auto* src = static_cast<const char*>(flat.data_ptr());
  for (size_t j = 0; j < u.members.size(); ++j) {
    at::Tensor& p = replicas[static_cast<size_t>(d)][u.members[j]];
    std::memcpy(p.data_ptr(), src + u.offsets[j] * sizeof(float), p.nbytes());
  }
}

ArrayList Trainer::Impl::outputs(size_t u) {
  const Unit& unit = units[u];
  if (unit.value.defined()) return {view_of(unit.value)};
  ArrayList outs;
  for (int d = 0; d < k; ++d)
    outs.push_back(view_of(replicas[static_cast<size_t>(d)][unit.members[0]]));
  return outs;
}

KVHandle Trainer::Impl::exchange(size_t u, const ArrayList& grads) {
  // One call: the store sends each slice's pull right behind its push, so a
  // server answers it as soon as the round is complete, while backward goes
  // on. Priority -i: the first layers are needed first by the next forward.
  return kv.pushpull_async({units[u].key}, {grads}, {outputs(u)},
                           -static_cast<int>(units[u].members[0]));
}

void Trainer::Impl::init() {
  if (initialised) return;
  std::vector<Key> keys;
  std::vector<ArrayView> values;
  std::vector<ArrayList> outs;
  for (size_t u = 0; u < units.size(); ++u) {
    const Unit& unit = units[u];
    keys.push_back(unit.key);
    if (unit.packed()) {
      gather(unit, 0, unit.value);
      values.push_back(view_of(unit.value));
      outs.push_back({view_of(unit.value)});
    } else {
      values.push_back(view_of(replicas[0][unit.members[0]]));
      ArrayList all;
      for (int d = 0; d < k; ++d)
        all.push_back(view_of(replicas[static_cast<size_t>(d)][unit.members[0]]));
      outs.push_back(std::move(all));
    }
  }
  kv.init(keys, values);
  // The store holds rank 0's values: every replica of every worker starts there.
  kv.pull(keys, outs);
  for (const Unit& unit : units) {
    if (!unit.packed()) continue;
    for (int d = 0; d < k; ++d)
      scatter(unit, unit.value, d);
  }
  initialised = true;
}

void Trainer::Impl::finish(size_t u, int64_t global_batch) {
  const Unit& unit = units[u];
  if (!opt.update_on_kvstore) {
    apply_local_update(u, global_batch);
  } else if (unit.packed()) {
    for (int d = 0; d < k; ++d)
      scatter(unit, unit.value, d);
  }
}

void Trainer::Impl::apply_local_update(size_t u, int64_t global_batch) {
  Unit& unit = units[u];
  at::Tensor& g = unit.value;
  // rescale_grad before the optimizer (which applies it first too), so the
  // batch size may change between steps.
  g.mul_(1.0 / static_cast<double>(global_batch));
  if (unit.packed()) {
    gather(unit, 0, unit.weight);
    local_optimizer->update(unit.key, view_of(unit.weight), view_of(g));
    for (int d = 0; d < k; ++d)
      scatter(unit, unit.weight, d);
    return;
  }
  const at::Tensor& w0 = replicas[0][unit.members[0]];
  local_optimizer->update(unit.key, view_of(w0), view_of(g));
  for (int d = 1; d < k; ++d) {
    std::memcpy(replicas[static_cast<size_t>(d)][unit.members[0]].data_ptr(), w0.data_ptr(),
                w0.nbytes());
  }
}

}  // namespace pushpull::torch
