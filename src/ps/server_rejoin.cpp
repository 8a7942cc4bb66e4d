// SPDX-License-Identifier: Apache-2.0
// Server rejoin (server.h, docs/ps.md "Server rejoin"): a restarted server
// asks every live server for the key ranges it backs up; each of them sends
// the mode and optimizer, then the ranges' states, then says done.
#include <signal.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ps/protocol.h"
#include "ps/server.h"
#include "pushpull/log.h"

namespace pushpull::ps {

void Server::rejoin() {
  const cluster::Placement p = node_.placement();
  std::vector<int> live;
  uint64_t generation;
  {
    std::lock_guard lock(repl_mu_);
    generation = ++rejoin_generation_;
    rejoin_waiting_.clear();
    for (int s = 0; s < node_.num_servers(); ++s)
      if (s != node_.rank() && !(static_cast<size_t>(s) < p.dead.size() && p.dead[s])) {
        rejoin_waiting_.insert(s);
        live.push_back(s);
      }
  }
  PP_WARN("server {} restarted (replacement {}): asking servers {} for its key ranges",
          node_.rank(), node_.incarnation(), fmt::join(live, ", "));
  for (int s : live)
    node_.send_copy(
        Role::kServer, s,
        transport::Header{
            .type = msg::kRejoinRequest, .flags = epoch_flags(p.epoch), .key = generation},
        nullptr, 0);
  if (live.empty()) return node_.report_rejoined();
  // Test hook (tests/e2e/ps_restart_test.cpp): the restarted server stops
  // while catching up, as a SIGSTOP landing at that moment would.
  if (node_.options().cluster.test_stop_while_catching_up) ::raise(SIGSTOP);
}

void Server::on_rejoin_request(int to, uint64_t generation) {
  const int me = node_.rank(), servers = node_.num_servers(), replicas = node_.ps_replicas();
  std::string setup;
  {
    std::lock_guard lock(repl_mu_);
    catching_up_.insert(to);
    setup = encode_mode(mode()) + "\n" + optimizer_spec_;
  }
  PP_WARN("server {}: sending server {} the key ranges it backs up", me, to);
  // First the mode and optimizer: the same connection keeps them ahead of
  // the ranges.
  node_.send_copy(Role::kServer, to, transport::Header{.type = msg::kRejoinSetup}, setup.data(),
                  setup.size());
  auto wanted = [this, to, me, servers, replicas](const PartId&, int home) {
    std::lock_guard lock(repl_mu_);
    if (cluster::replica_chain(home, servers, replicas, dead_, late_).primary != me) return false;
    for (int i = 0; i <= replicas; ++i)
      if ((home + i) % servers == to) return true;
    return false;
  };
  auto send = [this, to](const PartId& part, std::shared_ptr<const ReplicaState> state,
                         std::function<void()> done) {
    send_replica(part, std::move(state), {to}, std::move(done));
  };
  store()->transfer(wanted, send, [this, to, me, generation] {
    PP_INFO("server {}: every key range sent to server {}", me, to);
    node_.send_copy(Role::kServer, to,
                    transport::Header{.type = msg::kRejoinDone, .key = generation}, nullptr, 0);
  });
}

void Server::on_rejoin_setup(const std::string& text) {
  {
    std::lock_guard lock(repl_mu_);
    if (rejoin_setup_done_) return;
    rejoin_setup_done_ = true;
  }
  auto nl = text.find('\n');
  const std::string mode = text.substr(0, nl);
  const std::string spec = nl == std::string::npos ? "" : text.substr(nl + 1);
  Mode want;
  if (Status st = decode_mode(mode, &want); !st) {
    PP_ERROR("server {}: the job's mode from a live server: {}", node_.rank(), st.to_string());
  } else if (!(want == this->mode())) {
    set_mode(want);
  }
  if (!spec.empty()) {
    {
      std::lock_guard lock(repl_mu_);
      optimizer_spec_ = spec;
    }
    try {
      // request id 0: no answer is sent.
      store()->set_optimizer(RequestMeta{0, 0, 0}, OptimizerSpec::parse(spec));
    } catch (const std::exception& e) {
      PP_ERROR("server {}: cannot install the job's optimizer '{}': {}", node_.rank(), spec,
               e.what());
    }
  }
}

void Server::on_rejoin_done(int from, uint64_t generation) {
  bool all = false;
  {
    std::lock_guard lock(repl_mu_);
    // (A done of an earlier catch-up, restarted since, does not count.)
    if (generation != rejoin_generation_) return;
    all = rejoin_waiting_.erase(from) > 0 && rejoin_waiting_.empty();
  }
  if (!all) return;
  PP_WARN("server {}: caught up with every live server; rejoining as a backup", node_.rank());
  node_.report_rejoined();
}

}  // namespace pushpull::ps
