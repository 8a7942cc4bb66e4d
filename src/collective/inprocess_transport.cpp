// SPDX-License-Identifier: Apache-2.0
#include "collective/inprocess_transport.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace pushpull::collective {

struct InProcessFabric::Impl {
  struct Op {
    int peer;  // the other side: source for a recv, destination for a send
    uint64_t tag;
    void* buf;  // const for sends
    size_t bytes;
    Completion done;
  };
  struct Mailbox {
    std::deque<Op> sends_in;  // sends addressed to this rank, not yet matched
    std::deque<Op> recvs;     // receives this rank posted, not yet matched
    std::optional<Status> closed;
    int copying = 0;  // matched messages of this rank being copied right now
  };

  explicit Impl(int n) : boxes(static_cast<size_t>(n)) {}

  std::mutex mu;
  std::condition_variable copied;  // a copy ended (close() waits for them)
  std::vector<Mailbox> boxes;

  static std::optional<Op> take(std::deque<Op>& q, int peer, uint64_t tag) {
    for (auto it = q.begin(); it != q.end(); ++it) {
      if (it->peer == peer && it->tag == tag) {
        Op op = std::move(*it);
        q.erase(it);
        return op;
      }
    }
    return std::nullopt;
  }

  static Status gone(int rank, const Status& why) {
    return Status(ErrorCode::kPeerFailure,
                  fmt::format("collective: rank {} is gone ({})", rank, why.message()));
  }

  // Copies a matched pair outside the lock and completes both.
  // The caller counted the copy in both mailboxes under the lock.
  void deliver(int sender, int receiver, Op& send, Op& recv) {
    Status st;
    if (send.bytes != recv.bytes) {
      st = Status(ErrorCode::kProtocolError,
                  fmt::format("collective: message of {} bytes (tag {:#x}) for a receive of {} "
                              "bytes; the ranks disagree about the operation",
                              send.bytes, send.tag, recv.bytes));
    } else if (send.bytes > 0) {
      std::memcpy(recv.buf, send.buf, send.bytes);
    }
    {
      std::lock_guard lock(mu);
      --boxes[static_cast<size_t>(sender)].copying;
      --boxes[static_cast<size_t>(receiver)].copying;
    }
    copied.notify_all();
    send.done(st);
    recv.done(st);
  }

  void post(bool is_send, int self, int peer, uint64_t tag, void* buf, size_t bytes,
            Completion done) {
    Op mine{peer, tag, buf, bytes, std::move(done)};
    std::unique_lock lock(mu);
    if (peer < 0 || peer >= static_cast<int>(boxes.size())) {
      lock.unlock();
      mine.done(
          Status(ErrorCode::kInvalidArgument,
                 fmt::format("collective: rank {} does not exist (size {})", peer, boxes.size())));
      return;
    }
    if (boxes[self].closed) {
      Status st = *boxes[self].closed;
      lock.unlock();
      mine.done(st);
      return;
    }
    if (boxes[peer].closed) {
      Status st = gone(peer, *boxes[peer].closed);
      lock.unlock();
      mine.done(st);
      return;
    }
    if (is_send) {
      auto match = take(boxes[peer].recvs, self, tag);
      if (!match) {
        boxes[peer].sends_in.push_back(Op{self, tag, buf, bytes, std::move(mine.done)});
        return;
      }
      ++boxes[self].copying, ++boxes[peer].copying;
      lock.unlock();
      deliver(self, peer, mine, *match);
    } else {
      auto match = take(boxes[self].sends_in, peer, tag);
      if (!match) {
        boxes[self].recvs.push_back(std::move(mine));
        return;
      }
      ++boxes[self].copying, ++boxes[peer].copying;
      lock.unlock();
      deliver(peer, self, *match, mine);
    }
  }

  void close(int self, const Status& reason) {
    std::vector<std::pair<Completion, Status>> failed;
    {
      std::unique_lock lock(mu);
      if (boxes[self].closed) return;
      // A copy already matched finishes first: after close() returns nobody
      // touches this rank's buffers.
      // (a memcpy always ends; the deadline only honours the rule)
      copied.wait_for(lock, std::chrono::seconds(60), [&] { return boxes[self].copying == 0; });
      boxes[self].closed = reason;
      Status peer_sees = gone(self, reason);
      for (auto& op : boxes[self].sends_in)
        failed.emplace_back(std::move(op.done), peer_sees);
      for (auto& op : boxes[self].recvs)
        failed.emplace_back(std::move(op.done), reason);
      boxes[self].sends_in.clear();
      boxes[self].recvs.clear();
      for (size_t r = 0; r < boxes.size(); ++r) {
        if (static_cast<int>(r) == self) continue;
        auto& b = boxes[r];
        for (auto it = b.sends_in.begin(); it != b.sends_in.end();) {
          if (it->peer == self) {
            failed.emplace_back(std::move(it->done), reason);
            it = b.sends_in.erase(it);
          } else {
            ++it;
          }
        }
        for (auto it = b.recvs.begin(); it != b.recvs.end();) {
          if (it->peer == self) {
            failed.emplace_back(std::move(it->done), peer_sees);
            it = b.recvs.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    for (auto& [done, st] : failed)
      done(st);
  }
};

namespace {

class Endpoint final : public Transport {
 public:
  Endpoint(std::shared_ptr<InProcessFabric::Impl> f, int rank) : f_(std::move(f)), rank_(rank) {}
  ~Endpoint() override {
    close(Status(ErrorCode::kPeerFailure, fmt::format("rank {} closed its endpoint", rank_)));
  }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(f_->boxes.size()); }
  void post_send(int peer, uint64_t tag, const void* data, size_t bytes, Completion done) override {
    f_->post(true, rank_, peer, tag, const_cast<void*>(data), bytes, std::move(done));
  }
  void post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) override {
    f_->post(false, rank_, peer, tag, dst, bytes, std::move(done));
  }
  void close(const Status& reason) override { f_->close(rank_, reason); }

 private:
  std::shared_ptr<InProcessFabric::Impl> f_;
  int rank_;
};

}  // namespace

InProcessFabric::InProcessFabric(int size) {
  if (size < 1) throw InvalidArgument(fmt::format("InProcessFabric: size {} < 1", size));
  impl_ = std::make_shared<Impl>(size);
}
InProcessFabric::~InProcessFabric() = default;
int InProcessFabric::size() const {
  return static_cast<int>(impl_->boxes.size());
}
std::unique_ptr<Transport> InProcessFabric::endpoint(int rank) {
  if (rank < 0 || rank >= size())
    throw InvalidArgument(
        fmt::format("InProcessFabric: no rank {} in a fabric of {}", rank, size()));
  return std::make_unique<Endpoint>(impl_, rank);
}

}  // namespace pushpull::collective
