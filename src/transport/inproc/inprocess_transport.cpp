// SPDX-License-Identifier: Apache-2.0
#include "transport/inproc/inprocess_transport.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace pushpull::transport {

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
    // Matched messages of this rank being copied, and completions of its
    // operations being run, right now, by any thread: close() waits for
    // them, so none runs once it returned (the owner may be gone then).
    int busy = 0;
  };

  explicit Impl(int n) : boxes(static_cast<size_t>(n)) {}

  std::mutex mu;
  std::condition_variable idle;  // a busy count dropped
  std::vector<Mailbox> boxes;

  // The busy counts this thread holds (a completion that closes its own
  // rank must not wait for itself).
  struct Held {
    const Impl* fabric;
    int rank;
  };
  static thread_local std::vector<Held> held_here;

  int held_by_this_thread(int rank) const {
    return static_cast<int>(std::count_if(held_here.begin(), held_here.end(), [&](const Held& h) {
      return h.fabric == this && h.rank == rank;
    }));
  }

  // Runs `fn` counted as this thread holding one busy count of each rank in
  // `ranks` (counted under the lock by the caller), then gives them back.
  template <typename Fn>
  void while_held(std::initializer_list<int> ranks, Fn&& fn) {
    for (int r : ranks)
      held_here.push_back(Held{this, r});
    struct Release {
      Impl* f;
      std::initializer_list<int> ranks;
      ~Release() {
        for (size_t i = 0; i < ranks.size(); ++i)
          held_here.pop_back();
        {
          std::lock_guard lock(f->mu);
          for (int r : ranks)
            --f->boxes[static_cast<size_t>(r)].busy;
        }
        f->idle.notify_all();
      }
    } release{this, ranks};
    fn();
  }

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

  // Copies a matched pair outside the lock and completes both. The caller
  // counted the pair busy in both mailboxes under the lock.
  void deliver(int sender, int receiver, Op& send, Op& recv) {
    while_held({sender, receiver}, [&] {
      Status st;
      if (send.bytes != recv.bytes) {
        st = Status(ErrorCode::kProtocolError,
                    fmt::format("collective: message of {} bytes (tag {:#x}) for a receive of {} "
                                "bytes; the ranks disagree about the operation",
                                send.bytes, send.tag, recv.bytes));
      } else if (send.bytes > 0) {
        std::memcpy(recv.buf, send.buf, send.bytes);
      }
      send.done(st);
      recv.done(st);
    });
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
      ++boxes[self].busy, ++boxes[peer].busy;
      lock.unlock();
      deliver(self, peer, mine, *match);
    } else {
      auto match = take(boxes[self].sends_in, peer, tag);
      if (!match) {
        boxes[self].recvs.push_back(std::move(mine));
        return;
      }
      ++boxes[self].busy, ++boxes[peer].busy;
      lock.unlock();
      deliver(peer, self, *match, mine);
    }
  }

  void close(int self, const Status& reason) {
    struct Failed {
      int owner;  // the rank whose operation it is
      Completion done;
      Status status;
    };
    std::vector<Failed> failed;
    {
      std::unique_lock lock(mu);
      Mailbox& mine = boxes[static_cast<size_t>(self)];
      // Every copy and completion of this rank already under way ends first
      // (also on a second close): after close() returns nobody touches this
      // rank's buffers or runs its callbacks. The deadline only honours the
      // rule that every wait has one; a memcpy or a completion always ends.
      const int own = held_by_this_thread(self);
      idle.wait_for(lock, std::chrono::seconds(60), [&] { return mine.busy <= own; });
      if (mine.closed) return;
      mine.closed = reason;
      Status peer_sees = gone(self, reason);
      auto fail = [&](int owner, Op& op, const Status& st) {
        ++boxes[static_cast<size_t>(owner)].busy;
        failed.push_back(Failed{owner, std::move(op.done), st});
      };
      for (auto& op : mine.sends_in)
        fail(op.peer, op, peer_sees);
      for (auto& op : mine.recvs)
        fail(self, op, reason);
      mine.sends_in.clear();
      mine.recvs.clear();
      for (size_t r = 0; r < boxes.size(); ++r) {
        if (static_cast<int>(r) == self) continue;
        auto& b = boxes[r];
        for (auto it = b.sends_in.begin(); it != b.sends_in.end();) {
          if (it->peer == self) {
            fail(self, *it, reason);
            it = b.sends_in.erase(it);
          } else {
            ++it;
          }
        }
        for (auto it = b.recvs.begin(); it != b.recvs.end();) {
          if (it->peer == self) {
            fail(static_cast<int>(r), *it, peer_sees);
            it = b.recvs.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    for (auto& f : failed)
      while_held({f.owner}, [&] { f.done(f.status); });
  }
};

thread_local std::vector<InProcessFabric::Impl::Held> InProcessFabric::Impl::held_here;

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

}  // namespace pushpull::transport
