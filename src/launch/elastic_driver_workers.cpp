// SPDX-License-Identifier: Apache-2.0
// The elastic launcher's worker processes (elastic_driver_impl.h): starting
// one on a host, relaying its output, reaping it and deciding what its exit
// means for the job, and stopping it.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <fmt/format.h>

#include "launch/commands.h"
#include "launch/elastic_driver_impl.h"
#include "pushpull/log.h"

namespace pushpull::launch::elastic_detail {

void Driver::emit(Worker& w, bool err, std::string_view line) {
  std::string text = fmt::format("[{}] {}\n", w.label(), line);
  std::FILE* f = err ? stderr : stdout;
  std::fwrite(text.data(), 1, text.size(), f);
  std::fflush(f);  // in order with the launcher's own log lines
  if (w.log) *w.log << line << '\n';
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
  if (cfg_.tls) env.insert_or_assign("PUSHPULL_TLS", std::string(1, '1'));
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
    w->log = std::make_unique<PrivateLog>(fmt::format("{}/worker.{}.log", cfg_.log_dir, id));
  server_->add_worker(id);
  if (Status st = spawn_child(spec, &w->proc); !st) {
    server_->remove_worker(id, st.message());
    fail(127, fmt::format("elastic: worker {} on {} cannot start: {}", id, host, st.message()));
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
    // Quietly: the others may be finishing their own last steps.
    server_->remove_worker(w.id, fmt::format("elastic: {} (host {}) finished", w.label(), w.host),
                           /*announce=*/false);
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

}  // namespace pushpull::launch::elastic_detail
