// SPDX-License-Identifier: Apache-2.0
// The fixture of the ServerStore tests (server_store_test.cpp,
// server_store_requests_test.cpp): a Recorder that keeps every reply by
// request id, and ServerStoreTest, which makes a store and sends it init,
// push and pull requests. The Recorder is thread-safe (the store's executor
// threads reply); ServerStoreTest owns its store and is used by one test
// thread.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "ps/server_store.h"

namespace pushpull::ps::store_testing {

struct Reply {
  Status status;
  DType dtype;
  std::vector<std::byte> data;
};

class Recorder : public ServerResponder {
 public:
  void reply(const RequestMeta& to, const Status& s, DType dtype, std::span<const std::byte> data,
             std::shared_ptr<void>) override {
    std::lock_guard lock(mu_);
    replies_[to.request_id] = Reply{s, dtype, {data.begin(), data.end()}};
  }
  bool has(uint64_t id) {
    std::lock_guard lock(mu_);
    return replies_.count(id) > 0;
  }
  Reply get(uint64_t id) {
    std::lock_guard lock(mu_);
    auto it = replies_.find(id);
    if (it == replies_.end()) ADD_FAILURE() << "no reply to request " << id;
    return it == replies_.end() ? Reply{} : it->second;
  }
  std::vector<float> floats(uint64_t id) {
    Reply r = get(id);
    EXPECT_TRUE(r.status.is_ok()) << r.status.to_string();
    std::vector<float> out(r.data.size() / 4);
    std::memcpy(out.data(), r.data.data(), r.data.size());
    return out;
  }

 private:
  std::mutex mu_;
  std::map<uint64_t, Reply> replies_;
};

inline Payload payload_of(Array a) {
  auto owner = std::make_shared<Array>(std::move(a));
  return Payload{owner->view(), owner};
}

class ServerStoreTest : public ::testing::Test {
 protected:
  void make(int workers, bool sync, int threads = 2) {
    store_ = std::make_unique<ServerStore>(ServerStoreConfig{workers, sync, threads, 0}, rec_);
  }
  uint64_t next() { return ++id_; }
  uint64_t init(uint64_t key, Array value, int worker = 0) {
    uint64_t id = next();
    store_->init({worker, id}, PartId{key, 0}, fmt::format("k{}", key),
                 payload_of(std::move(value)));
    return id;
  }
  uint64_t push(int worker, uint64_t key, Array grad, bool compressed = false) {
    uint64_t id = next();
    store_->push({worker, id}, PartId{key, 0}, payload_of(std::move(grad)), compressed);
    return id;
  }
  // A pushpull's push (kFlagPullBack): answered with the value once applied.
  uint64_t push_pull(int worker, uint64_t key, Array grad, uint32_t seq = 0) {
    uint64_t id = next();
    RequestMeta m{worker, id};
    m.pull_back = true;
    store_->push(m, PartId{key, 0}, payload_of(std::move(grad)), false, seq);
    return id;
  }
  uint64_t pull(int worker, uint64_t key, std::vector<Range> ranges = {}) {
    uint64_t id = next();
    store_->pull({worker, id}, PartId{key, 0}, std::move(ranges));
    return id;
  }
  void idle() { store_->wait_idle(Millis(10000)); }

  Recorder rec_;
  std::unique_ptr<ServerStore> store_;
  uint64_t id_ = 0;
};
}  // namespace pushpull::ps::store_testing
