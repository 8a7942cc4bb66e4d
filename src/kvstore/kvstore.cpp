// SPDX-License-Identifier: Apache-2.0
// The blocking conveniences of KVStore: each wraps the batch call and waits.
#include "pushpull/kvstore.h"

#include "base/executor.h"

namespace pushpull {

KVHandle::KVHandle(std::shared_ptr<Completion> c) : c_(std::move(c)) {}

bool KVHandle::done() const {
  return !c_ || c_->done();
}

void KVHandle::wait(Millis timeout) const {
  if (c_) c_->wait_for(timeout).raise();
}

KVStore::~KVStore() = default;

namespace {

std::vector<ArrayList> one_each(const std::vector<ArrayView>& arrays) {
  std::vector<ArrayList> lists;
  lists.reserve(arrays.size());
  for (const ArrayView& a : arrays)
    lists.push_back(ArrayList{a});
  return lists;
}

}  // namespace

void KVStore::push(const Key& key, const ArrayView& value, int priority) {
  wait(push_async({key}, {ArrayList{value}}, priority));
}
void KVStore::push(const Key& key, const ArrayList& values, int priority) {
  wait(push_async({key}, {values}, priority));
}
void KVStore::push(const std::vector<Key>& keys, const std::vector<ArrayView>& values,
                   int priority) {
  wait(push_async(keys, one_each(values), priority));
}
void KVStore::push(const std::vector<Key>& keys, const std::vector<ArrayList>& values,
                   int priority) {
  wait(push_async(keys, values, priority));
}

void KVStore::pull(const Key& key, const ArrayView& out, int priority) {
  wait(pull_async({key}, {ArrayList{out}}, priority));
}
void KVStore::pull(const Key& key, const ArrayList& outs, int priority) {
  wait(pull_async({key}, {outs}, priority));
}
void KVStore::pull(const std::vector<Key>& keys, const std::vector<ArrayView>& outs, int priority) {
  wait(pull_async(keys, one_each(outs), priority));
}
void KVStore::pull(const std::vector<Key>& keys, const std::vector<ArrayList>& outs, int priority) {
  wait(pull_async(keys, outs, priority));
}

void KVStore::pushpull(const Key& key, const ArrayView& value, const ArrayView& out, int priority) {
  wait(pushpull_async({key}, {ArrayList{value}}, {ArrayList{out}}, priority));
}
void KVStore::pushpull(const Key& key, const ArrayList& values, const ArrayList& outs,
                       int priority) {
  wait(pushpull_async({key}, {values}, {outs}, priority));
}
void KVStore::pushpull(const std::vector<Key>& keys, const std::vector<ArrayList>& values,
                       const std::vector<ArrayList>& outs, int priority) {
  wait(pushpull_async(keys, values, outs, priority));
}

void KVStore::row_sparse_pull(const Key& key, const ArrayView& out, const ArrayView& row_ids,
                              int priority) {
  wait(row_sparse_pull_async(key, ArrayList{out}, row_ids, priority));
}
void KVStore::row_sparse_pull(const Key& key, const ArrayList& outs, const ArrayView& row_ids,
                              int priority) {
  wait(row_sparse_pull_async(key, outs, row_ids, priority));
}

}  // namespace pushpull
