// SPDX-License-Identifier: Apache-2.0
// The Scheduler's failure handling (scheduler.h): nodes lost, away, back
// or failed over; processes that exited or restart; the job aborted.
#include "cluster/scheduler.h"

#include <cstring>

#include <fmt/format.h>

#include "cluster/describe.h"
#include "pushpull/log.h"

namespace pushpull::cluster {

namespace {

// How long after a worker exited 0 without registering the others may still
// follow it (a job whose workers never open a store) before the job fails.
constexpr Millis kUnregisteredExitGrace{2000};

std::string describe_exit(int exit_code, int signal) {
  if (signal > 0) {
    const char* name = ::sigabbrev_np(signal);
    return fmt::format("was killed by signal {}{}", signal,
                       name ? fmt::format(" (SIG{})", name) : std::string());
  }
  return fmt::format("exited with code {}", exit_code);
}

}  // namespace

void Scheduler::on_close(transport::ConnId id, const transport::PeerInfo&, const Status& why) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(id);
  if (it == nodes_.end() || it->second.left || finished_) return;
  lose(id, fmt::format("its connection closed ({}); it crashed, was killed or lost the network",
                       why.message()));
}

void Scheduler::lose(transport::ConnId id, const std::string& reason) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  NodeAddress who = it->second.addr;
  if (who.rank < 0) who.rank = it->second.preferred;
  live_.forget(id);
  nodes_.erase(it);
  // Its barrier arrivals go (an away worker blocks the barrier until its
  // replacement arrives or moves past it: BarrierBook).
  if (who.rank >= 0) barriers_.lose({who.role, who.rank});
  if (who.role == Role::kWorker && mark_away(who, reason)) {
    // A stopped worker that wakes up must not act as the rank any more.
    auto bye = encode_dead(who, "this worker was replaced: " + reason);
    transport_->send_copy(id, transport::Header{.type = msg::kAbort}, bye.data(), bye.size());
    transport_->close(id, {ErrorCode::kPeerFailure, "worker lost; waiting for its replacement"});
    return;
  }
  const int servers = options_.cluster.num_servers;
  if (who.role != Role::kServer || replicas_ == 0 || !complete_ || !failure_.is_ok() ||
      who.rank < 0 || who.rank >= servers) {
    fail(who, reason);
    return;
  }
  placement_.dead[static_cast<size_t>(who.rank)] = true;
  if (static_cast<size_t>(who.rank) < placement_.late.size())
    placement_.late[static_cast<size_t>(who.rank)] = 0;
  // A restarted server lost while catching up: its connections are stale.
  placement_.restarting.resize(placement_.dead.size(), false);
  placement_.restarting[static_cast<size_t>(who.rank)] = false;
  ++server_losses_[who.rank];
  if (int home = first_lost_home(servers, replicas_, placement_.dead); home >= 0) {
    std::string chain;
    for (int i = 0; i <= replicas_; ++i)
      chain += fmt::format("{}{}", i ? ", " : "", (home + i) % servers);
    fail(who, fmt::format("{}; no replica left: the key ranges placed on server {} lived on "
                          "servers {} (PUSHPULL_PS_REPLICAS={}), all dead",
                          reason, home, chain, replicas_));
    return;
  }
  placement_.epoch++;
  PP_WARN("fail-over: {} failed: {}; its key ranges move to their backups (placement epoch {})",
          describe_node(who), reason, placement_.epoch);
  // A stopped server that wakes up later must not serve anyone: it is told
  // to abort, and its connection is closed.
  auto bye = encode_dead(who, "this server was failed over: " + reason);
  broadcast(msg::kPlacement, encode_placement(placement_));
  settle_barriers();  // a barrier of servers no longer waits for this one
  transport_->send_copy(id, transport::Header{.type = msg::kAbort}, bye.data(), bye.size());
  transport_->close(id, {ErrorCode::kPeerFailure, "failed over"});
}

bool Scheduler::mark_away(const NodeAddress& who, const std::string& reason) {
  if (!worker_restarts_ || !complete_ || !failure_.is_ok() || who.rank < 0 ||
      who.rank >= options_.cluster.num_workers)
    return false;
  away_[who.rank] = {clock_.now(), reason};
  ++losses_[who.rank];
  PP_WARN(
      "{} lost: {}; waiting up to {} ms for its replacement (--max-restarts); the servers hold "
      "its round open",
      describe_node(who), reason, options_.cluster.startup_timeout.count());
  cv_.notify_all();
  return true;
}

void Scheduler::rejoin(transport::ConnId id, Entry e) {
  const int rank = e.preferred;
  const bool server = e.addr.role == Role::kServer;
  e.addr.rank = rank;
  if (!server) away_.erase(rank);
  live_.heard(id);
  if (!transport_->bind_peer_rank(id, rank))
    PP_WARN("{} {}'s replacement said hello with another rank; its connection keeps that identity",
            role_name(e.addr.role), rank);
  nodes_[id] = e;
  (server ? book_.servers : book_.workers)[static_cast<size_t>(rank)] = e.addr;
  if (server) {
    placement_.restarting.resize(placement_.dead.size(), false);
    placement_.restarting[static_cast<size_t>(rank)] = true;
  }
  // The placement first: the replacement connects only to live servers.
  if (placement_.epoch > 0) {
    auto p = encode_placement(placement_);
    transport_->send_copy(id, transport::Header{.type = msg::kPlacement}, p.data(), p.size());
  }
  AddressBook book = book_;
  book.incarnation = server ? server_losses_[rank] : losses_[rank];
  auto p = encode_book(rank, book);
  transport_->send_copy(id, transport::Header{.type = msg::kAddressBook}, p.data(), p.size());
  if (server)
    PP_WARN("server {} registered again (replacement {}, {}); it fetches its key ranges", rank,
            book.incarnation, e.addr.describe());
  else
    PP_WARN("worker {} rejoined the job (replacement {}, {})", rank, book.incarnation,
            e.addr.describe());
}

Status Scheduler::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

int Scheduler::server_losses(int rank) const {
  std::lock_guard lock(mu_);
  auto it = server_losses_.find(rank);
  return it == server_losses_.end() ? 0 : it->second;
}

void Scheduler::allow_worker_restarts(bool on) {
  std::lock_guard lock(mu_);
  worker_restarts_ = on;
}

int Scheduler::worker_losses(int rank) const {
  std::lock_guard lock(mu_);
  auto it = losses_.find(rank);
  return it == losses_.end() ? 0 : it->second;
}

void Scheduler::process_restarting(Role role, int rank, int exit_code, int signal) {
  std::lock_guard lock(mu_);
  if (finished_ || !failure_.is_ok()) return;
  if (role == Role::kServer) {
    PP_INFO("server {} {}; the launcher restarts it", rank, describe_exit(exit_code, signal));
    return;
  }
  if (role != Role::kWorker) return;
  std::string why = fmt::format("its process {}", describe_exit(exit_code, signal));
  if (away_.count(rank)) {
    PP_INFO("worker {} {}; the launcher restarts it", rank, describe_exit(exit_code, signal));
    return;
  }
  for (auto& [id, n] : nodes_)
    if (n.addr.role == Role::kWorker && (n.preferred == rank || n.addr.rank == rank))
      return lose(id, why);
  // Not registered: it died while the job started (which fails the job), or
  // its replacement died before registering (still away: above).
  PP_INFO("worker {} {} before it registered", rank, describe_exit(exit_code, signal));
}

bool Scheduler::failed_over(Role role, int rank) const {
  std::lock_guard lock(mu_);
  // Once the job failed nothing goes on without anyone: a server whose loss
  // left a range without a replica is the cause, not a fail-over (its exit
  // then carries the scheduler's verdict, "no replica left").
  return failure_.is_ok() && role == Role::kServer && rank >= 0 &&
         static_cast<size_t>(rank) < placement_.dead.size() &&
         placement_.dead[static_cast<size_t>(rank)];
}

uint64_t Scheduler::placement_epoch() const {
  std::lock_guard lock(mu_);
  return placement_.epoch;
}

void Scheduler::fail(const NodeAddress& who, const std::string& reason) {
  if (!failure_.is_ok()) return;
  std::string msg = fmt::format("{} failed: {}", describe_node(who), reason);
  PP_ERROR("job failed: {}", msg);
  failure_ = {ErrorCode::kPeerFailure, msg};
  broadcast(msg::kPeerDead, encode_dead(who, reason));
  cv_.notify_all();
}

void Scheduler::abort_job(Status why) {
  if (!failure_.is_ok()) return;
  PP_ERROR("job failed: {}", why.message());
  failure_ = why;
  broadcast(msg::kAbort,
            encode_dead({Role::kScheduler, 0, options_.cluster.root_uri, port()}, why.message()));
  cv_.notify_all();
}

void Scheduler::process_exited(Role role, int rank, int exit_code, int signal) {
  std::lock_guard lock(mu_);
  if (finished_ || !failure_.is_ok()) {
    PP_DEBUG("{} {} {} after the job ended", role_name(role), rank,
             describe_exit(exit_code, signal));
    return;
  }
  if (role == Role::kServer && rank >= 0 && static_cast<size_t>(rank) < placement_.dead.size() &&
      placement_.dead[static_cast<size_t>(rank)]) {
    PP_INFO("server {} (failed over) {}", rank, describe_exit(exit_code, signal));
    return;
  }
  if (role == Role::kWorker && away_.count(rank)) {
    fail({Role::kWorker, rank, "", 0},
         fmt::format("{}; its process {} and was not restarted (no restarts left)",
                     away_[rank].reason, describe_exit(exit_code, signal)));
    return;
  }
  Entry* e = find_node(role, rank);
  if (e && e->left) return;  // it left in order: its exit is the normal end
  NodeAddress who = e ? e->addr : NodeAddress{role, rank, "", 0};
  if (who.rank < 0) who.rank = rank;
  if (exit_code != 0 || signal > 0) {
    std::string why = fmt::format("its process {}", describe_exit(exit_code, signal));
    if (e) {
      for (auto& [id, n] : nodes_) {
        if (&n != e) continue;
        if (role == Role::kWorker && worker_restarts_) {
          // The launcher does not restart it (that is process_restarting).
          live_.forget(id);
          nodes_.erase(id);
          return fail(who, why + " and was not restarted (no restarts left)");
        }
        return lose(id, why);
      }
    }
    fail(who, why);
    return;
  }
  if (e) {
    fail(who, "its process exited (code 0) without leaving the job (no orderly shutdown)");
    return;
  }
  if (role != Role::kWorker) {
    // A server that ends cleanly without registering ran a program that does
    // not use the scheduler (e.g. one script for every role): harmless unless
    // registered nodes are waiting for it.
    if (!nodes_.empty())
      fail(who,
           "its process exited (code 0) before it registered, while registered nodes wait "
           "for it");
    else
      PP_INFO("{} {} exited (code 0) without joining the job", role_name(role), rank);
    return;
  }
  if (exited_unregistered_.empty()) first_unregistered_exit_ = clock_.now();
  exited_unregistered_.insert(rank);
  PP_INFO("worker {} exited (code 0) without joining the job", rank);
  check_unregistered_exits();
  cv_.notify_all();
}

void Scheduler::check_unregistered_exits() {
  if (exited_unregistered_.empty() || finished_ || !failure_.is_ok()) return;
  const int workers = options_.cluster.num_workers;
  const int first = *exited_unregistered_.begin();
  NodeAddress who{Role::kWorker, first, "", 0};
  auto waiting_fail = [&](const std::string& why) {
    fail(who, fmt::format("its process exited (code 0) without joining the job, {}", why));
  };
  if (count_registered(Role::kWorker) > 0)
    return waiting_fail("while registered workers wait for it to register");
  if (static_cast<int>(exited_unregistered_.size()) >= workers) {
    // No worker ever joined and every one is done: a job that did not use
    // the servers. Tell the registered servers to stop.
    PP_WARN(
        "every worker exited without joining the job; stopping the servers (hint: workers that "
        "use only collectives or torch.distributed leave the servers idle; launch them with -s "
        "0)");
    for (auto& [id, e] : nodes_) {
      transport_->send_copy(id, transport::Header{.type = msg::kWorkersDone}, nullptr, 0);
      transport_->send_copy(id, transport::Header{.type = msg::kShutdown}, nullptr, 0);
    }
    finished_ = true;
    cv_.notify_all();
    return;
  }
  if (clock_.now() - first_unregistered_exit_ >= kUnregisteredExitGrace)
    waiting_fail(fmt::format(
        "and {} other workers did not finish within {} ms (a job whose workers never join ends "
        "only when all of them exit 0)",
        workers - static_cast<int>(exited_unregistered_.size()), kUnregisteredExitGrace.count()));
}

}  // namespace pushpull::cluster
