// SPDX-License-Identifier: Apache-2.0
// The dist_sync_allreduce store as an elastic participant (commit, abandon,
// restore, re-bind, re-sync; see kvstore/allreduce_store.h).
#include <cstring>

#include <fmt/format.h>

#include "kvstore/allreduce_store.h"
#include "pushpull/elastic_kvstore.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

namespace pushpull {
namespace {

// dst <- src (same shape and dtype); allocates dst when it does not fit.
void copy_value(Array& dst, const Array& src) {
  if (dst.empty() || dst.nbytes() != src.nbytes() || dst.dtype() != src.dtype()) {
    dst = Array::copy_of(src.view());
    return;
  }
  if (src.nbytes()) std::memcpy(dst.data(), src.data(), src.nbytes());
}

}  // namespace

void AllreduceStore::elastic_save() {
  wait_all();  // this worker's pushes applied: the copy is of a whole step
  std::shared_lock lock(mu_);
  for (auto& [key, e] : entries_)
    copy_value(e->saved, e->value);
}

void AllreduceStore::elastic_abandon() {
  // Shutting the old communicator fails every allreduce still pending on it
  // at once (PeerFailure), so the applies waiting for them run (and fail)
  // now instead of at their deadline; the group re-forms anyway.
  collective::Communicator* old = comm_;
  comm_ = nullptr;
  if (old) old->shutdown();
  try {
    exec_.wait_idle(wait_timeout());
  } catch (const std::exception& e) {
    PP_WARN("{} store: abandoning its pending operations: {}", type_, e.what());
  }
  // The new round names its pushes from slot 0 again, on every member alike.
  std::shared_lock lock(mu_);
  for (auto& [key, e] : entries_) {
    std::lock_guard submit(e->submit_mu);
    e->pushes = 0;
    e->busy = {};
  }
}

void AllreduceStore::elastic_restore() {
  std::shared_lock lock(mu_);
  for (auto& [key, e] : entries_)
    if (!e->saved.empty() && e->saved.nbytes() == e->value.nbytes() && e->saved.nbytes())
      std::memcpy(e->value.data(), e->saved.data(), e->saved.nbytes());
}

void AllreduceStore::elastic_rebind() {
  if (!follow_)
    throw InvalidArgument(fmt::format(
        "'{}' store: built over a fixed communicator, it cannot follow the group", type_));
  comm_ = &follow_();
  PP_DEBUG("{} store re-bound: worker {} of {}", type_, rank(), num_workers());
}

void AllreduceStore::elastic_sync() {
  wait_all();
  collective::Communicator& c = comm();
  std::shared_lock lock(mu_);
  // Keys in the map's order, the same on every member (all hold the same keys).
  std::vector<collective::Handle> handles;
  for (auto& [key, e] : entries_)
    if (e->value.numel() > 0)
      handles.push_back(c.broadcast_async(e->name + ".sync", e->value.view(), 0));
  for (const auto& h : handles)
    c.wait(h, wait_timeout());
  for (auto& [key, e] : entries_)
    copy_value(e->saved, e->value);
}

void elastic_track_store(collective::elastic::State& state, KVStore& store) {
  auto* s = dynamic_cast<AllreduceStore*>(&store);
  if (!s || !s->follows_group())
    throw InvalidArgument(
        fmt::format("elastic: a '{}' store cannot follow the group's re-formation; only a "
                    "dist_sync_allreduce store created in an elastic worker can",
                    store.type()));
  state.add_participant(*s);
}

}  // namespace pushpull
