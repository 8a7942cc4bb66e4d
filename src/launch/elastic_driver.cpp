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
#include "collective/elastic_rendezvous.h"
#include "launch/commands.h"
#include "launch/elastic_discovery.h"
#include "launch/line_splitter.h"
#include "launch/spawn.h"
#include "launch/supervisor.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

namespace pushpull::launch {

using Clock = std::chrono::steady_clock;
namespace {

namespace ce = collective::elastic;

struct Worker {
  std::string id;
  std::string host;
  Spawned proc;
  LineSplitter out_lines, err_lines;
  std::unique_ptr<std::ofstream> log;
  bool stopping = false;  // asked to stop by the launcher (not a failure of its own)
  Clock::time_point stop_sent{};
  bool killed = false;
  std::string label() const { return "worker " + id; }
};

struct HostState {
  HostEntry entry;
  int blocked = 0;  // slots whose worker failed and was not replaced
};

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return describe_status(true, WEXITSTATUS(status));
  return describe_status(false, WTERMSIG(status));
}
int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class Driver {
 public:
  Driver(const LaunchConfig& cfg, const ElasticConfig& ec, const LaunchContext& ctx)
      : cfg_(cfg), ec_(ec), ctx_(ctx) {}

  int run();

 private:
  void update_hosts(const std::vector<HostEntry>& found);
  void spawn_missing();
  void spawn_on(const std::string& host);
  void pump_output(int timeout_ms);
  void reap();
  void on_exit(Worker& w, int status);
  void stop(Worker& w, bool kill_now);
  void stop_all();
  bool check_min_workers();
  int live() const;
  int live_on(const std::string& host) const;
  void emit(Worker& w, bool err, std::string_view line);
  void fail(int code, const std::string& why);

  const LaunchConfig& cfg_;
  const ElasticConfig& ec_;
  const LaunchContext& ctx_;
  std::unique_ptr<SignalGuard> signals_;
  std::unique_ptr<ce::RendezvousServer> server_;
  std::string server_addr_;
  std::map<std::string, HostState> hosts_;  // by host name
  std::vector<std::string> host_order_;     // discovery order
  std::map<pid_t, std::unique_ptr<Worker>> workers_;
  int next_id_ = 0;
  int restarts_used_ = 0;
  bool finishing_ = false;  // a worker exited 0: training is over
  bool failed_after_finish_ = false;
  int successes_ = 0;
  std::string last_failure_;
  int last_failure_code_ = 1;
  std::optional<Clock::time_point> below_min_since_;
  std::optional<int> result_;
  std::string result_reason_;
  int signalled_ = 0;
};

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

void Driver::emit(Worker& w, bool err, std::string_view line) {
  std::string text = fmt::format("[{}] {}\n", w.label(), line);
  std::FILE* f = err ? stderr : stdout;
  std::fwrite(text.data(), 1, text.size(), f);
  std::fflush(f);  // in order with the launcher's own log lines
  if (w.log) *w.log << line << '\n';
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

void Driver::spawn_on(const std::string& host) {
  const std::string id = std::to_string(next_id_++);
  const bool local = cfg_.launcher == LauncherKind::kLocal;
  std::map<std::string, std::string> env;
  env["PUSHPULL_ELASTIC_ADDR"] = server_addr_;
  env["PUSHPULL_ELASTIC_ID"] = id;
  env["PUSHPULL_ELASTIC_TIMEOUT"] = fmt::format("{}", ec_.elastic_timeout_s);
  env["PUSHPULL_JOB_ID"] = cfg_.job_id;
  if (!cfg_.job_secret.empty()) env["PUSHPULL_JOB_SECRET"] = cfg_.job_secret;
  if (cfg_.allow_insecure) env.insert_or_assign("PUSHPULL_ALLOW_INSECURE", std::string(1, '1'));
  if (cfg_.timeout_s > 0) env["PUSHPULL_TIMEOUT"] = fmt::format("{}", cfg_.timeout_s);
  if (!cfg_.interface.empty()) env["DMLC_INTERFACE"] = cfg_.interface;
  if (!is_loopback_host(host)) env["PUSHPULL_NODE_HOST"] = host;
  for (const EnvList* list : {&cfg_.env, &cfg_.env_worker})
    for (const auto& [k, v] : *list)
      env[k] = v;

  ChildSpec spec;
  spec.label = "worker " + id;
  spec.host = host;
  spec.role = Role::kWorker;
  if (local) {
    auto vars = ctx_.env.vars();
    for (const auto& [k, v] : env)
      vars[k] = v;
    for (const auto& [k, v] : vars)
      spec.env.push_back(k + "=" + v);
    spec.argv = cfg_.command;
    spec.workdir = cfg_.workdir;
  } else {
    ProcessSpec p;
    p.role = Role::kWorker;
    p.host = host;
    p.ssh_port = hosts_.at(host).entry.ssh_port;
    p.env = env;
    p.argv = cfg_.command;
    spec.argv = ssh_argv(cfg_, p);
    for (const auto& [k, v] : ctx_.env.vars())
      spec.env.push_back(k + "=" + v);
    spec.stop_by_closing_stdin = true;
    spec.stdin_data = ssh_stdin(p.env);
  }
  auto w = std::make_unique<Worker>();
  w->id = id;
  w->host = host;
  if (!cfg_.log_dir.empty())
    w->log = std::make_unique<std::ofstream>(fmt::format("{}/worker.{}.log", cfg_.log_dir, id));
  server_->add_worker(id);
  if (std::string why = spawn_child(spec, &w->proc); !why.empty()) {
    server_->remove_worker(id, why);
    fail(127, fmt::format("elastic: worker {} on {} cannot start: {}", id, host, why));
    return;
  }
  PP_INFO("elastic: started worker {} on {} (pid {}); {} workers", id, host, w->proc.pid,
          live() + 1);
  workers_[w->proc.pid] = std::move(w);
}

void Driver::pump_output(int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, bool>> who;
  fds.push_back({signals_->fd(), POLLIN, 0});
  who.emplace_back(nullptr, false);
  for (auto& [pid, w] : workers_) {
    if (w->proc.out_r.get() >= 0) {
      fds.push_back({w->proc.out_r.get(), POLLIN, 0});
      who.emplace_back(w.get(), false);
    }
    if (w->proc.err_r.get() >= 0) {
      fds.push_back({w->proc.err_r.get(), POLLIN, 0});
      who.emplace_back(w.get(), true);
    }
  }
  if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    if (i == 0) {
      signalfd_siginfo info;
      while (::read(signals_->fd(), &info, sizeof info) == sizeof info) {
        int sig = static_cast<int>(info.ssi_signo);
        if (sig == SIGCHLD) continue;  // reap() looks at every worker
        if (signalled_ == 0) {
          signalled_ = sig;
          PP_WARN("elastic: {} received: stopping every worker", signal_name(sig));
          stop_all();
        } else {
          for (auto& [pid, w] : workers_)
            stop(*w, true);
        }
      }
      continue;
    }
    auto [w, err] = who[i];
    char buf[65536];
    Fd& fd = err ? w->proc.err_r : w->proc.out_r;
    for (;;) {
      ssize_t n = ::read(fd.get(), buf, sizeof buf);
      if (n > 0) {
        (err ? w->err_lines : w->out_lines)
            .feed(std::string_view(buf, static_cast<size_t>(n)),
                  [&](std::string_view line) { emit(*w, err, line); });
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        (err ? w->err_lines : w->out_lines).flush([&](std::string_view line) {
          emit(*w, err, line);
        });
        fd.reset();
      }
      break;
    }
  }
}

void Driver::reap() {
  for (auto it = workers_.begin(); it != workers_.end();) {
    int status = 0;
    pid_t r = ::waitpid(it->first, &status, WNOHANG);
    if (r != it->first) {
      // Escalate a stop that outlived the grace period.
      Worker& w = *it->second;
      if (w.stopping && !w.killed &&
          Clock::now() - w.stop_sent > Millis(static_cast<int64_t>(cfg_.grace_s * 1000)))
        stop(w, true);
      ++it;
      continue;
    }
    Worker& w = *it->second;
    // Drain what is left of its output first.
    for (Fd* fd : {&w.proc.out_r, &w.proc.err_r}) {
      if (fd->get() < 0) continue;
      char buf[65536];
      ssize_t n;
      bool err = fd == &w.proc.err_r;
      while ((n = ::read(fd->get(), buf, sizeof buf)) > 0)
        (err ? w.err_lines : w.out_lines)
            .feed(std::string_view(buf, static_cast<size_t>(n)),
                  [&](std::string_view line) { emit(w, err, line); });
      (err ? w.err_lines : w.out_lines).flush([&](std::string_view line) { emit(w, err, line); });
    }
    on_exit(w, status);
    it = workers_.erase(it);
  }
}

void Driver::on_exit(Worker& w, int status) {
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  const std::string how = describe_exit(status);
  if (w.stopping) {
    server_->remove_worker(
        w.id, fmt::format("elastic: {} (host {}) was stopped by the launcher", w.label(), w.host));
    PP_INFO("elastic: {} stopped ({})", w.label(), how);
    return;
  }
  if (ok) {
    server_->remove_worker(w.id, fmt::format("elastic: {} (host {}) finished", w.label(), w.host));
    ++successes_;
    if (!finishing_) PP_INFO("elastic: {} finished: no new workers from now on", w.label());
    finishing_ = true;
    return;
  }
  const std::string why = fmt::format("{} (host {}) failed: {}", w.label(), w.host, how);
  server_->remove_worker(w.id, fmt::format("collective: {}", why));
  last_failure_ = why;
  last_failure_code_ = exit_code_of(status);
  if (finishing_) {
    failed_after_finish_ = true;
    PP_ERROR("elastic: {} after training finished", why);
    return;
  }
  if (restarts_used_ < ec_.max_restarts) {
    ++restarts_used_;
    PP_WARN("elastic: {}; replacing it (restart {} of --max-restarts {})", why, restarts_used_,
            ec_.max_restarts);
  } else {
    if (auto h = hosts_.find(w.host); h != hosts_.end()) ++h->second.blocked;
    PP_WARN("elastic: {}; continuing with {} workers (its slot stays empty{})", why, live() - 1,
            ec_.discovery_script.empty() ? "" : " until the discovery script adds one");
  }
}

void Driver::stop(Worker& w, bool kill_now) {
  if (kill_now) {
    ::kill(-w.proc.pid, SIGKILL);
    w.killed = true;
  } else {
    w.proc.stdin_w.reset();  // ssh clients: end of file asks the remote side to stop
    ::kill(-w.proc.pid, SIGTERM);
    ::kill(-w.proc.pid, SIGCONT);
  }
  if (!w.stopping) w.stop_sent = Clock::now();
  w.stopping = true;
}

void Driver::stop_all() {
  for (auto& [pid, w] : workers_)
    if (!w->stopping) stop(*w, false);
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
  if (!cfg_.log_dir.empty()) std::filesystem::create_directories(cfg_.log_dir);
  ce::ServerConfig sc;
  sc.net.job_id = cfg_.job_id;
  sc.net.job_secret = cfg_.job_secret;
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

}  // namespace

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
