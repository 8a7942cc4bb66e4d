// SPDX-License-Identifier: Apache-2.0
#include "launch/commands.h"

#include <cctype>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::launch {

bool is_sensitive_name(std::string_view name) {
  std::string upper;
  for (char c : name)
    upper += char(std::toupper(static_cast<unsigned char>(c)));
  for (const char* word : {"SECRET", "TOKEN", "PASSWORD", "PASSWD"})
    if (upper.find(word) != std::string::npos) return true;
  return false;
}

std::string masked_value(std::string_view name, std::string_view value) {
  return is_sensitive_name(name) ? std::string("<hidden>") : std::string(value);
}

std::map<std::string, std::string> sensitive_only(const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : env)
    if (is_sensitive_name(k)) out[k] = v;
  return out;
}

std::string shell_quote(std::string_view s) {
  bool plain = !s.empty();
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.' || c == '/' || c == ':' || c == ',' || c == '=' ||
              c == '@' || c == '+' || c == '%';
    plain = plain && ok;
  }
  if (plain) return std::string(s);
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  out += '\'';
  return out;
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) {
    if (!out.empty()) out += ' ';
    out += shell_quote(w);
  }
  return out;
}

std::string remote_script(const std::string& workdir, const std::map<std::string, std::string>& env,
                          const std::vector<std::string>& argv, double grace_s) {
  std::string s;
  // Credentials arrive on stdin, never on a command line (ssh's or the
  // remote shell's are visible in `ps` on both hosts). `read` takes one byte
  // at a time from a pipe, so the rest of the channel stays for the watcher.
  for (const auto& [k, v] : sensitive_only(env))
    s += fmt::format(
        "IFS= read -r {} || {{ echo 'pushpull launch: no value for {} on stdin' >&2; exit 127; "
        "}}\nexport {}\n",
        k, k, k);
  if (!workdir.empty())
    s += fmt::format("cd {} || {{ echo 'pushpull launch: cannot cd into '{} >&2; exit 127; }}\n",
                     shell_quote(workdir), shell_quote(workdir));
  for (const auto& [k, v] : env)
    if (!is_sensitive_name(k)) s += fmt::format("export {}={}\n", k, shell_quote(v));
  // Without job control a background job's stdin is /dev/null, so the
  // channel's stdin is kept on fd 3 for the watcher below.
  s += "exec 3<&0\n";
  // A background job of a non-interactive shell is not a group leader, so
  // setsid(1) runs the program itself (same pid) as leader of a new group.
  s += "setsid " + shell_join(argv) + " </dev/null 3<&- &\n";
  s += "pid=$!\n";
  // The watcher owns the channel's stdin: end of file means "stop". It
  // holds no output fd, so it never keeps the ssh session open.
  s += fmt::format(
      "( while read -r _; do :; done; kill -TERM -$pid 2>/dev/null; sleep {}; "
      "kill -KILL -$pid 2>/dev/null ) <&3 >/dev/null 2>&1 &\n",
      grace_s > 0 ? grace_s : 1);
  s += "exec 3<&-\n";
  s += "watcher=$!\n";
  s += "wait $pid; rc=$?\n";
  s += "kill $watcher 2>/dev/null\n";
  s += "exit $rc\n";
  return s;
}

std::string ssh_stdin(const std::map<std::string, std::string>& env) {
  std::string out;
  for (const auto& [k, v] : sensitive_only(env)) {
    if (v.find('\n') != std::string::npos)
      throw InvalidArgument(fmt::format("{} holds a newline: it cannot be passed over ssh", k));
    out += v + "\n";
  }
  return out;
}

namespace {

std::vector<std::string> ssh_base(const LaunchConfig& cfg, int port) {
  std::vector<std::string> a = {"ssh", "-o", "BatchMode=yes", "-p", std::to_string(port)};
  a.insert(a.end(), cfg.ssh_options.begin(), cfg.ssh_options.end());
  return a;
}

// Variables that differ between processes of one role. Horovod's four go (the
// size too): under mpirun or srun a script must see an MPI-style job, as
// horovodrun's MPI mode sets none of them.
bool per_process(const std::string& k) {
  return k == "RANK" || k == "PUSHPULL_RANK" || k == "LOCAL_RANK" || k == "PUSHPULL_LOCAL_RANK" ||
         k == "LOCAL_WORLD_SIZE" || k == "PUSHPULL_LOCAL_SIZE" || k == "DMLC_NODE_HOST" ||
         k == "PUSHPULL_NODE_HOST" || k == "PUSHPULL_HOST_PROCESS_INDEX" || k == "HOROVOD_RANK" ||
         k == "HOROVOD_SIZE" || k == "HOROVOD_LOCAL_RANK" || k == "HOROVOD_LOCAL_SIZE";
}

}  // namespace

std::vector<std::string> ssh_argv(const LaunchConfig& cfg, const ProcessSpec& p) {
  auto a = ssh_base(cfg, p.ssh_port);
  a.push_back("--");
  a.push_back(p.host);
  a.push_back("sh -c " + shell_quote(remote_script(cfg.workdir, p.env, p.argv, cfg.grace_s)));
  return a;
}

std::vector<std::string> rsync_argv(const LaunchConfig& cfg, const HostEntry& host,
                                    const std::string& src_dir, const std::string& dst_dir) {
  std::string src = src_dir;
  if (src.empty() || src.back() != '/') src += '/';  // copy the contents, not the folder
  return {"rsync",
          "-a",
          "-e",
          shell_join(ssh_base(cfg, host.ssh_port)),
          "--rsync-path",
          fmt::format("mkdir -p {} && rsync", shell_quote(dst_dir)),
          "--",  // the directories are never options, whatever they are named
          src,
          fmt::format("{}:{}", host.host, dst_dir)};
}

std::vector<std::string> rsync_fetch_argv(const LaunchConfig& cfg, const HostEntry& host,
                                          const std::string& remote_glob,
                                          const std::string& dst_dir) {
  return {"rsync",      "-a",
          "-e",         shell_join(ssh_base(cfg, host.ssh_port)),
          "--",         fmt::format("{}:{}", host.host, remote_glob),
          dst_dir + "/"};
}

std::map<std::string, std::string> role_env(const LaunchConfig& cfg, const Rendezvous& rv,
                                            Role role) {
  ProcessSpec p;
  p.role = role;
  auto env = process_env(cfg, rv, p);
  std::erase_if(env, [](const auto& kv) { return per_process(kv.first); });
  return env;
}

std::map<std::string, std::string> launcher_env(const LaunchConfig& cfg, const Rendezvous& rv) {
  auto out = sensitive_only(role_env(cfg, rv, Role::kWorker));
  if (cfg.num_servers > 0) {
    for (const auto& [k, v] : sensitive_only(role_env(cfg, rv, Role::kServer))) {
      auto [it, fresh] = out.emplace(k, v);
      if (!fresh && it->second != v)
        throw InvalidArgument(fmt::format(
            "--launcher {} passes {} through its own environment, which holds one value: give "
            "servers and workers the same one",
            launcher_name(cfg.launcher), k));
    }
  }
  return out;
}

std::vector<std::string> mpirun_argv(const LaunchConfig& cfg, const Rendezvous& rv, bool as_root) {
  std::vector<std::string> a = {"mpirun"};
  if (as_root) a.push_back("--allow-run-as-root");
  a.push_back("--oversubscribe");
  if (!cfg.hosts.empty()) {
    std::string list;
    for (const auto& h : cfg.hosts) {
      if (!list.empty()) list += ',';
      list += h.slots > 0 ? fmt::format("{}:{}", h.host, h.slots) : h.host;
    }
    a.insert(a.end(), {"--host", list});
  }
  if (!cfg.workdir.empty()) a.insert(a.end(), {"--wdir", cfg.workdir});
  auto context = [&](Role role, int n, const std::vector<std::string>& argv) {
    a.insert(a.end(), {"-np", std::to_string(n)});
    for (const auto& [k, v] : role_env(cfg, rv, role))
      a.insert(a.end(), {"-x", is_sensitive_name(k) ? k : k + "=" + v});
    a.insert(a.end(), argv.begin(), argv.end());
  };
  context(Role::kWorker, cfg.num_workers, cfg.command);
  if (cfg.num_servers > 0) {
    a.push_back(":");
    context(Role::kServer, cfg.num_servers, {"/bin/sh", "-c", "exec " + cfg.server_command});
  }
  return a;
}

SrunCommand srun_command(const LaunchConfig& cfg, const Rendezvous& rv,
                         const std::string& conf_path) {
  SrunCommand c;
  int total = cfg.num_workers + cfg.num_servers;
  c.argv = {"srun", fmt::format("--ntasks={}", total), "--kill-on-bad-exit=1"};
  if (!cfg.workdir.empty()) c.argv.push_back("--chdir=" + cfg.workdir);
  c.argv.insert(c.argv.end(), {"--multi-prog", conf_path});
  auto line = [&](Role role, int first, int count, const char* rank_spec,
                  const std::vector<std::string>& argv) {
    std::vector<std::string> words = {"env"};
    for (const auto& [k, v] : role_env(cfg, rv, role))
      if (!is_sensitive_name(k)) words.push_back(k + "=" + v);
    // srun replaces %t (task number) and %o (offset in this line's range).
    words.push_back(fmt::format("PUSHPULL_RANK={}", rank_spec));
    if (role == Role::kWorker) words.push_back(fmt::format("RANK={}", rank_spec));
    words.insert(words.end(), argv.begin(), argv.end());
    std::string range =
        count == 1 ? std::to_string(first) : fmt::format("{}-{}", first, first + count - 1);
    return range + " " + shell_join(words) + "\n";
  };
  c.multi_prog = "# written by pushpull launch (job " + cfg.job_id + ")\n";
  c.multi_prog += line(Role::kWorker, 0, cfg.num_workers, "%t", cfg.command);
  if (cfg.num_servers > 0)
    c.multi_prog += line(Role::kServer, cfg.num_workers, cfg.num_servers, "%o",
                         {"/bin/sh", "-c", "exec " + cfg.server_command});
  return c;
}

}  // namespace pushpull::launch
