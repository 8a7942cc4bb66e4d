// SPDX-License-Identifier: Apache-2.0
// The elastic launcher (elastic_driver.h): one loop on the main thread that
// reads the children's output and the signals, reaps workers, re-runs the
// discovery script, starts workers on free slots, forms rendezvous rounds
// and decides when the job has failed.
#include "launch/elastic_driver.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "base/clock.h"
#include "base/private_file.h"
#include "collective/elastic_rendezvous.h"
#include "launch/commands.h"
#include "launch/elastic_discovery.h"
#include "launch/elastic_driver_impl.h"
#include "launch/line_splitter.h"
#include "launch/spawn.h"
#include "launch/supervisor.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

namespace pushpull::launch {
namespace elastic_detail {

int Driver::live() const {
  int n = 0;
  for (const auto& [pid, w] : workers_)
    if (!w->stopping) ++n;
  return n;
}

int Driver::live_on(const std::string& host) const {
  int n = 0;
  for (const auto& [pid, w] : workers_)
    if (!w->stopping && w->host == host) ++n;
  return n;
}

void Driver::update_hosts(const std::vector<HostEntry>& found) {
  std::map<std::string, HostEntry> now;
  for (const auto& h : found)
    now[h.host] = h;
  bool changed = false;
  // Hosts that vanished lose their workers; hosts with fewer slots lose the
  // failed slots first, then their newest workers.
  for (auto it = hosts_.begin(); it != hosts_.end();) {
    auto f = now.find(it->first);
    if (f == now.end()) {
      PP_WARN("elastic: host {} left the discovered hosts; stopping its workers", it->first);
      for (auto& [pid, w] : workers_)
        if (w->host == it->first && !w->stopping) stop(*w, false);
      it = hosts_.erase(it);
      changed = true;
      continue;
    }
    HostState& hs = it->second;
    if (f->second.slots < hs.entry.slots) {
      int lost = hs.entry.slots - f->second.slots;
      hs.blocked = std::max(0, hs.blocked - lost);
    }
    if (f->second.slots != hs.entry.slots) changed = true;
    hs.entry = f->second;
    int extra = live_on(it->first) - std::max(0, hs.entry.slots - hs.blocked);
    for (auto w = workers_.rbegin(); w != workers_.rend() && extra > 0; ++w)
      if (w->second->host == it->first && !w->second->stopping) {
        stop(*w->second, false);
        --extra;
      }
    ++it;
  }
  host_order_.clear();
  for (const auto& h : found) {
    host_order_.push_back(h.host);
    if (!hosts_.count(h.host)) {
      hosts_[h.host] = HostState{h, 0};
      changed = true;
      PP_INFO("elastic: host {} offers {} slots", h.host, h.slots);
    }
  }
  if (changed) PP_DEBUG("elastic: {} hosts known", hosts_.size());
}

void Driver::spawn_missing() {
  if (finishing_ || result_) return;
  const int cap = ec_.max_workers;
  for (const auto& host : host_order_) {
    auto it = hosts_.find(host);
    if (it == hosts_.end()) continue;
    const HostState& hs = it->second;
    while (live() < cap && live_on(host) < hs.entry.slots - hs.blocked)
      spawn_on(host);
  }
}

void Driver::fail(int code, const std::string& why) {
  if (result_) return;
  result_ = code;
  result_reason_ = why;
  server_->refuse_all(Status(ErrorCode::kInternal, why));
  stop_all();
}

bool Driver::check_min_workers() {
  if (finishing_ || result_ || signalled_) return true;
  const int n = live();
  if (n >= ec_.min_workers) {
    below_min_since_.reset();
    return true;
  }
  const auto now = Clock::now();
  if (!below_min_since_) below_min_since_ = now;
  const bool can_grow = !ec_.discovery_script.empty();
  const auto waited = now - *below_min_since_;
  if (can_grow && waited < Millis(static_cast<int64_t>(ec_.elastic_timeout_s * 1000))) return true;
  fail(last_failure_code_ == 0 ? 1 : last_failure_code_,
       fmt::format("elastic: {} worker{} left, fewer than --min-workers {}{}{}", n,
                   n == 1 ? "" : "s", ec_.min_workers,
                   can_grow ? fmt::format(" for {} s (--elastic-timeout)", ec_.elastic_timeout_s)
                            : std::string(" and no --host-discovery-script to add any"),
                   last_failure_.empty() ? "" : "; the last failure: " + last_failure_));
  return false;
}

int Driver::run() {
  signals_ = std::make_unique<SignalGuard>();
  if (!cfg_.log_dir.empty()) base::make_private_dirs(cfg_.log_dir, "--log-dir");
  ce::ServerConfig sc;
  sc.net.job_id = cfg_.job_id;
  sc.net.job_secret = cfg_.job_secret;
  sc.net.tls = cfg_.tls;
  sc.bind_host = cfg_.bind_any ? "" : cfg_.host_ip;
  sc.port = cfg_.port;
  sc.min_workers = ec_.min_workers;
  if (cfg_.timeout_s > 0) sc.startup_window = Millis(static_cast<int64_t>(cfg_.timeout_s * 2000));
  sc.member_window = Millis(static_cast<int64_t>(ec_.rejoin_timeout_s * 1000));
  server_ = std::make_unique<ce::RendezvousServer>(sc);
  server_addr_ = fmt::format("{}:{}", cfg_.host_ip, server_->port());
  PP_INFO("elastic: rendezvous at {}; {}..{} workers", server_addr_, ec_.min_workers,
          ec_.max_workers);

  // The hosts: the discovery script's, -H's, or this host's -n slots.
  const Millis script_timeout(10000);
  if (!ec_.discovery_script.empty()) {
    try {
      update_hosts(run_discovery(ec_.discovery_script, script_timeout));
    } catch (const InvalidArgument& e) {
      PP_ERROR("job failed: elastic: {}", e.what());
      return 2;
    }
  } else if (!cfg_.hosts.empty()) {
    update_hosts(cfg_.hosts);
  } else {
    update_hosts({HostEntry{"127.0.0.1", 22, cfg_.num_workers}});
  }
  auto next_discovery =
      Clock::now() + Millis(static_cast<int64_t>(ec_.discovery_interval_s * 1000));
  spawn_missing();

  for (;;) {
    pump_output(100);
    reap();
    if (workers_.empty() && (result_ || finishing_ || signalled_)) break;
    if (!result_ && !signalled_) {
      if (!ec_.discovery_script.empty() && Clock::now() >= next_discovery) {
        try {
          update_hosts(run_discovery(ec_.discovery_script, script_timeout));
        } catch (const InvalidArgument& e) {
          PP_WARN("elastic: {} (keeping the hosts as they were)", e.what());
        }
        next_discovery =
            Clock::now() + Millis(static_cast<int64_t>(ec_.discovery_interval_s * 1000));
      }
      if (check_min_workers()) spawn_missing();
      for (const auto& id : server_->poll()) {
        for (auto& [pid, w] : workers_)
          if (w->id == id && !w->stopping) {
            PP_ERROR("elastic: {} did not re-join its group in time (hung?): killing it",
                     w->label());
            last_failure_ =
                fmt::format("{} (host {}) hung: it did not re-join in time", w->label(), w->host);
            if (auto h = hosts_.find(w->host); h != hosts_.end()) ++h->second.blocked;
            stop(*w, true);
          }
      }
      if (workers_.empty() && !finishing_ && !result_) {
        // Nobody left and nobody can be started.
        check_min_workers();
        if (!result_)
          fail(last_failure_code_,
               fmt::format(
                   "elastic: no workers left{}",
                   last_failure_.empty() ? std::string() : "; the last failure: " + last_failure_));
      }
    }
  }
  server_.reset();
  if (signalled_) {
    PP_ERROR("job failed: the launcher received {}", signal_name(signalled_));
    return 128 + signalled_;
  }
  if (result_) {
    PP_ERROR("job failed: {}", result_reason_);
    return *result_ == 0 ? 1 : *result_;
  }
  if (failed_after_finish_) {
    PP_ERROR("job failed: {}", last_failure_);
    return last_failure_code_;
  }
  PP_INFO("elastic: job finished ({} workers exited 0)", successes_);
  return 0;
}

}  // namespace elastic_detail

using elastic_detail::Driver;

void prepare_elastic(LaunchConfig& cfg, ElasticConfig& ec, const LaunchContext& ctx) {
  auto bad = [](const std::string& m) { throw InvalidArgument(m); };
  if (cfg.num_servers > 0) bad("elastic jobs are collective-only: use -s 0 (or leave -s out)");
  if (cfg.nnodes > 0) bad("--nnodes and --min-workers/--max-workers do not mix");
  if (cfg.launcher != LauncherKind::kLocal && cfg.launcher != LauncherKind::kSsh)
    bad("elastic jobs run with the local or ssh launcher");
  if (ec.min_workers < 0 || ec.max_workers < 0) bad("--min-workers/--max-workers must be >= 1");
  if (ec.elastic_timeout_s <= 0) bad("--elastic-timeout must be positive");
  if (ec.max_restarts < 0) bad("--max-restarts must not be negative");
  if (ec.rejoin_timeout_s <= 0) bad("--rejoin-timeout must be positive");
  // No cap given: -n workers on this host or -H's slots; with a discovery
  // script, as many as it offers slots.
  if (ec.max_workers == 0)
    ec.max_workers =
        ec.discovery_script.empty() ? std::max(cfg.num_workers, ec.min_workers) : (1 << 20);
  if (ec.min_workers == 0) ec.min_workers = 1;
  if (ec.min_workers > ec.max_workers)
    bad(fmt::format("--min-workers {} is more than --max-workers {}", ec.min_workers,
                    ec.max_workers));
  // The launcher's checks with what is known now: a local job has no -H.
  cfg.num_servers = 0;
  std::vector<HostEntry> hosts = cfg.hosts;
  if (!ec.discovery_script.empty()) {
    if (!hosts.empty()) bad("give either -H or --host-discovery-script, not both");
    // Remote hosts from the script need ssh (and an address they can reach).
    auto found = run_discovery(ec.discovery_script, Millis(10000));
    bool remote = false;
    for (const auto& h : found)
      remote = remote || !is_loopback_host(h.host);
    if (remote) {
      cfg.launcher = LauncherKind::kSsh;
      cfg.hosts = found;
    }
  }
  const int n = cfg.num_workers;
  cfg.num_workers = 1;  // the slots are checked by the driver, not the plan
  std::vector<HostEntry> saved = cfg.hosts;
  for (auto& h : cfg.hosts)
    h.slots = 0;
  prepare(cfg, ctx);
  cfg.hosts = saved;
  cfg.num_workers = n;
}

int run_elastic(const LaunchConfig& cfg, const ElasticConfig& ec, const LaunchContext& ctx) {
  if (ctx.dry_run) {
    fmt::print("# pushpull launch (elastic): {}..{} workers, launcher {}, job {}{}\n",
               ec.min_workers, ec.max_workers, launcher_name(cfg.launcher), cfg.job_id,
               ec.discovery_script.empty() ? "" : ", hosts from " + ec.discovery_script);
    return 0;
  }
  Driver d(cfg, ec, ctx);
  return d.run();
}

}  // namespace pushpull::launch
