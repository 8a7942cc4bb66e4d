// SPDX-License-Identifier: Apache-2.0
// ServerStore's control commands, run once every executor thread has reached
// them (on_all_threads): the optimizer, and saving or loading its states.
#include <condition_variable>
#include <mutex>

#include <fmt/format.h>

#include "ps/server_store.h"
#include "ps/server_store_entry.h"

namespace pushpull::ps {

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
    auto bytes = std::make_shared<std::string>(opt->save_states());
    responder_.reply(m, Status::ok(), DType::kUInt8,
                     {reinterpret_cast<const std::byte*>(bytes->data()), bytes->size()}, bytes);
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
