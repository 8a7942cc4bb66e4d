// SPDX-License-Identifier: Apache-2.0
// Helpers of the networked server's tests (server_test.cpp,
// server_lending_test.cpp): an Inbox that collects a node's PS answers by
// request id, and the bytes and headers of hand-made requests. The Inbox is
// thread-safe (a node's I/O thread adds, the test thread waits).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "ps/protocol.h"
#include "transport/message.h"

namespace pushpull::ps::server_testing {

struct Answer {
  uint16_t type = 0;
  uint32_t flags = 0;
  std::vector<std::byte> payload;
  ErrorCode code() const {
    return type == msg::kError ? static_cast<ErrorCode>(flags) : ErrorCode::kOk;
  }
};

// Collects a worker's PS answers by request id.
class Inbox {
 public:
  void add(transport::Message&& m) {
    std::lock_guard lock(mu_);
    answers_[m.header.request_id] = Answer{
        m.header.type, m.header.flags, {m.payload.data(), m.payload.data() + m.payload.size()}};
    cv_.notify_all();
  }
  Answer wait(uint64_t id) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return answers_.count(id) > 0; })) {
      ADD_FAILURE() << "no answer to request " << id;
      return {};
    }
    return answers_[id];
  }
  bool has(uint64_t id) {
    std::lock_guard lock(mu_);
    return answers_.count(id) > 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Answer> answers_;
};

inline std::span<const std::byte> bytes_of(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}

inline transport::Header header(uint16_t type, uint64_t key, uint64_t begin, uint64_t count,
                                DType dtype = DType::kFloat32) {
  transport::Header h;
  h.type = type;
  h.key = key;
  h.offset = begin;
  h.length = count;
  h.dtype = static_cast<uint32_t>(dtype);
  return h;
}

}  // namespace pushpull::ps::server_testing
