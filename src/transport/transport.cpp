// SPDX-License-Identifier: Apache-2.0
#include "transport/transport.h"

#include <fmt/format.h>

namespace pushpull::transport {

Request::Request() : state_(std::make_shared<State>()) {}

Completion Request::completion() const {
  return [s = state_](const Status& st) {
    {
      std::lock_guard lock(s->mu);
      s->status = st;
      s->done = true;
    }
    s->cv.notify_all();
  };
}

bool Request::done() const {
  std::lock_guard lock(state_->mu);
  return state_->done;
}

void Request::wait(Deadline deadline, std::string_view what) const {
  std::unique_lock lock(state_->mu);
  if (!state_->cv.wait_until(lock, deadline, [&] { return state_->done; })) {
    throw Timeout(fmt::format(
        "collective: {} did not complete before its deadline; a peer is stuck or too slow "
        "(raise the peer timeout, or check the other ranks' logs)",
        what));
  }
  state_->status.raise();
}

Request isend(Transport& t, int peer, uint64_t tag, const void* data, size_t bytes) {
  Request r;
  t.post_send(peer, tag, data, bytes, r.completion());
  return r;
}

Request irecv(Transport& t, int peer, uint64_t tag, void* dst, size_t bytes) {
  Request r;
  t.post_recv(peer, tag, dst, bytes, r.completion());
  return r;
}

}  // namespace pushpull::transport
