// SPDX-License-Identifier: Apache-2.0
// The Node's messages (node.h): the scheduler's control messages (address
// book, barriers, placements, failures, shutdown) and the sends and receives
// to a peer named by role and rank (conn: its connection, or why there is
// none).
#include <algorithm>

#include <fmt/format.h>

#include "cluster/describe.h"
#include "cluster/node.h"
#include "pushpull/log.h"

namespace pushpull::cluster {

void Node::on_control(transport::Message&& m) {
  std::span<const std::byte> payload(m.payload.data(), m.payload.size());
  std::unique_lock lock(mu_);
  if (m.conn != scheduler_) {
    lock.unlock();
    PP_ERROR("control message type {} from a node other than the scheduler; ignored",
             m.header.type);
    return;
  }
  live_.heard(0);
  switch (m.header.type) {
    case msg::kAddressBook: {
      int32_t rank = -1;
      AddressBook book;
      Status s = decode_book(payload, &rank, &book);
      if (!s) {
        lock.unlock();
        fail(s);
        return;
      }
      book_ = std::move(book);
      rank_ = rank;
      joined_epoch_ = placement_.epoch;  // a replacement's placement came first
      have_book_ = true;
      cv_.notify_all();
      return;
    }
    case msg::kBarrierDone: {
      auto& done = barrier_done_[static_cast<uint8_t>(m.header.key)];
      done = std::max(done, m.header.request_id);
      cv_.notify_all();
      return;
    }
    case msg::kShutdown:
      shutdown_ = true;
      cv_.notify_all();
      return;
    case msg::kWorkersDone:
      workers_done_ = true;
      cv_.notify_all();
      return;
    case msg::kPlacement: {
      Placement p;
      Status s = decode_placement(payload, &p);
      lock.unlock();
      if (!s) return fail(s);
      apply_placement(std::move(p));
      return;
    }
    case msg::kPeerDead:
    case msg::kAbort: {
      NodeAddress who;
      std::string reason;
      Status s = decode_dead(payload, &who, &reason);
      lock.unlock();
      if (!s) return fail(s);
      if (m.header.type == msg::kAbort)
        fail({ErrorCode::kPeerFailure, reason});
      else
        fail({ErrorCode::kPeerFailure, fmt::format("{} failed: {}", describe_node(who), reason)});
      return;
    }
    default:
      return;  // heartbeats
  }
}

transport::ConnId Node::conn(Role role, int rank) const {
  std::lock_guard lock(mu_);
  if (!failure_locked().is_ok()) failure_locked().raise();
  if (role == Role::kScheduler) return scheduler_;
  if (role == Role::kServer && rank >= 0 && static_cast<size_t>(rank) < placement_.dead.size() &&
      placement_.dead[static_cast<size_t>(rank)] && !peers_.count({role, rank}))
    throw PeerFailure(
        fmt::format("server {} was failed over (placement epoch {})", rank, placement_.epoch));
  auto it = peers_.find({role, rank});
  if (it == peers_.end())
    throw NotFound(
        fmt::format("{} {} has no connection to {} {} (workers connect to the servers, and "
                    "to each other only for the collectives' bootstrap; servers to workers)",
                    role_name(this->role()), rank_, role_name(role), rank));
  return it->second;
}

bool Node::wait_connected(Role role, int rank, Millis timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout,
                      [&] {
                        return !failure_locked().is_ok() || stop_heartbeat_ ||
                               peers_.count({role, rank}) != 0 ||
                               (role == Role::kServer &&
                                static_cast<size_t>(rank) < placement_.dead.size() &&
                                placement_.dead[static_cast<size_t>(rank)]);
                      }) &&
         failure_locked().is_ok() && peers_.count({role, rank}) != 0;
}

void Node::send(Role role, int rank, transport::Header h, const void* data, size_t n,
                transport::SendDone done, int priority) {
  transport::ConnId id;
  try {
    id = conn(role, rank);
  } catch (const Error&) {
    if (done) done(Status::from_current_exception());
    return;
  }
  transport_->send(id, h, data, n, std::move(done), priority);
}

Status Node::send_copy(Role role, int rank, transport::Header h, const void* data, size_t n,
                       int priority) {
  try {
    return transport_->send_copy(conn(role, rank), h, data, n, priority);
  } catch (const Error&) {
    return Status::from_current_exception();
  }
}

Status Node::post_recv(Role role, int rank, transport::RecvMatch match, void* dst, size_t capacity,
                       transport::RecvDone done) {
  try {
    return transport_->post_recv(conn(role, rank), match, dst, capacity, std::move(done));
  } catch (const Error&) {
    return Status::from_current_exception();
  }
}

}  // namespace pushpull::cluster
