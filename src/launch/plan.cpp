// SPDX-License-Identifier: Apache-2.0
#include "launch/plan.h"

#include <fmt/format.h>

#include "base/rank_environment.h"
#include "pushpull/error.h"

namespace pushpull::launch {

std::string_view launcher_name(LauncherKind k) {
  switch (k) {
    case LauncherKind::kLocal:
      return "local";
    case LauncherKind::kSsh:
      return "ssh";
    case LauncherKind::kMpi:
      return "mpi";
    case LauncherKind::kSlurm:
      return "slurm";
  }
  return "invalid";
}

std::optional<LauncherKind> parse_launcher(std::string_view t) {
  if (t == "local") return LauncherKind::kLocal;
  if (t == "ssh") return LauncherKind::kSsh;
  if (t == "mpi") return LauncherKind::kMpi;
  if (t == "slurm") return LauncherKind::kSlurm;
  return std::nullopt;
}

std::string ProcessSpec::label() const {
  return fmt::format("{} {}", role_name(role), rank);
}

std::vector<size_t> place(const std::vector<HostEntry>& hosts, int num_servers, int num_workers,
                          size_t spare_hosts) {
  if (spare_hosts > 0) {
    if (spare_hosts >= hosts.size())
      throw InvalidArgument(
          "--server-hosts leaves no host for the workers: name the workers' hosts with -H");
    if (num_servers < static_cast<int>(spare_hosts))
      throw InvalidArgument(
          fmt::format("-s {} is fewer servers than the {} --server-hosts (one server runs on each)",
                      num_servers, spare_hosts));
    const size_t first_spare = hosts.size() - spare_hosts;
    std::vector<size_t> out;
    for (size_t s = 0; s < spare_hosts; ++s)
      out.push_back(first_spare + s);
    const std::vector<HostEntry> rest(hosts.begin(),
                                      hosts.begin() + static_cast<ptrdiff_t>(first_spare));
    for (size_t h : place(rest, num_servers - static_cast<int>(spare_hosts), num_workers))
      out.push_back(h);
    return out;
  }
  const size_t total = static_cast<size_t>(num_servers) + static_cast<size_t>(num_workers);
  std::vector<size_t> out;
  out.reserve(total);
  if (hosts.empty()) {
    out.assign(total, 0);
    return out;
  }
  bool all_slots = true;
  size_t capacity = 0;
  for (const auto& h : hosts) {
    all_slots = all_slots && h.slots > 0;
    capacity += static_cast<size_t>(h.slots);
  }
  if (all_slots && capacity < total)
    throw InvalidArgument(fmt::format(
        "the hostfile has {} slots in all but the job needs {} processes ({} servers + {} "
        "workers): add hosts or slots, or run fewer processes",
        capacity, total, num_servers, num_workers));
  std::vector<size_t> used(hosts.size(), 0);
  auto full = [&](size_t h) { return hosts[h].slots > 0 && used[h] >= size_t(hosts[h].slots); };
  if (all_slots) {
    size_t h = 0;
    for (size_t i = 0; i < total; ++i) {
      while (full(h))
        ++h;
      out.push_back(h);
      ++used[h];
    }
    return out;
  }
  // Round robin; servers and workers each start from the first host, so both
  // roles spread evenly (MXNet's launch.py does the same).
  for (int count : {num_servers, num_workers}) {
    size_t h = 0;
    for (int i = 0; i < count; ++i) {
      while (full(h))
        h = (h + 1) % hosts.size();  // terminates: some host is unlimited
      out.push_back(h);
      ++used[h];
      h = (h + 1) % hosts.size();
    }
  }
  return out;
}

std::map<std::string, std::string> process_env(const LaunchConfig& cfg, const Rendezvous& rv,
                                               const ProcessSpec& p) {
  std::map<std::string, std::string> env;
  auto both = [&](const char* dmlc, const char* pp, std::string value) {
    if (dmlc) env[dmlc] = value;
    env[pp] = std::move(value);
  };
  const std::string role(role_name(p.role));
  both("DMLC_ROLE", "PUSHPULL_ROLE", role);
  both("DMLC_PS_ROOT_URI", "PUSHPULL_ROOT_URI", rv.addr);
  both("DMLC_PS_ROOT_PORT", "PUSHPULL_ROOT_PORT", std::to_string(rv.port));
  const int world = cfg.num_workers * (cfg.nnodes > 0 ? cfg.nnodes : 1);  // per-node mode
  both("DMLC_NUM_WORKER", "PUSHPULL_NUM_WORKER", std::to_string(world));
  const int servers = cfg.num_servers * (cfg.nnodes > 0 ? cfg.nnodes : 1);
  both("DMLC_NUM_SERVER", "PUSHPULL_NUM_SERVER", std::to_string(servers));
  both("DMLC_NODE_HOST", "PUSHPULL_NODE_HOST", p.host);
  if (!cfg.interface.empty()) both("DMLC_INTERFACE", "PUSHPULL_INTERFACE", cfg.interface);
  env["PUSHPULL_RANK"] = std::to_string(p.rank);
  env["PUSHPULL_JOB_ID"] = cfg.job_id;
  if (!cfg.job_secret.empty()) env["PUSHPULL_JOB_SECRET"] = cfg.job_secret;
  // (Not `= "1"`: g++ 12 warns, wrongly, -Wrestrict on that assignment here.)
  if (cfg.allow_insecure) env.insert_or_assign("PUSHPULL_ALLOW_INSECURE", std::string(1, '1'));
  if (cfg.tls) env.insert_or_assign("PUSHPULL_TLS", std::string(1, '1'));
  if (cfg.timeout_s > 0) env["PUSHPULL_TIMEOUT"] = fmt::format("{}", cfg.timeout_s);
  if (p.role == Role::kWorker) {
    // torchrun's names describe the workers only: servers are not part of the
    // collective world, and a program that reads RANK must not see a server
    // rank there.
    // Horovod's names too, as horovodrun's Gloo mode sets them: scripts (and
    // Horovod's own tests) read HOROVOD_RANK to tell that job, which may
    // init() again after shutdown(), from an MPI one; pushpull's may too.
    for (auto& [name, value] : rank_variables(p.rank, world, p.local_rank, p.local_size))
      env[name] = std::move(value);
    const bool own_master = !rv.master_addr.empty();  // -s > 0: not the scheduler's port
    both("MASTER_ADDR", "PUSHPULL_MASTER_ADDR", own_master ? rv.master_addr : rv.addr);
    const int master_port = own_master ? rv.master_port : rv.port;
    env["MASTER_PORT"] = std::to_string(master_port);
    // -s 0: pushpull's own rendezvous is `port` (which the launcher may hold
    // for worker 0) even when a torch store gets MASTER_PORT of its own.
    env["PUSHPULL_MASTER_PORT"] = std::to_string(cfg.num_servers == 0 ? rv.port : master_port);
  }
  auto apply = [&](const EnvList& list) {
    for (const auto& [k, v] : list)
      env[k] = v;
  };
  apply(cfg.env);
  apply(p.role == Role::kServer ? cfg.env_server : cfg.env_worker);
  return env;
}

std::vector<ProcessSpec> make_plan(const LaunchConfig& cfg, const Rendezvous& rv) {
  auto hosts_of = place(cfg.hosts, cfg.num_servers, cfg.num_workers, cfg.spare_hosts);
  std::vector<ProcessSpec> plan;
  plan.reserve(hosts_of.size());
  // Per host and role: how many so far (local rank) and in all (local size).
  std::map<std::pair<size_t, Role>, int> next, count;
  std::map<size_t, int> on_host;  // per host: its processes so far (servers, then workers)
  for (size_t i = 0; i < hosts_of.size(); ++i) {
    Role role = i < size_t(cfg.num_servers) ? Role::kServer : Role::kWorker;
    ++count[{hosts_of[i], role}];
  }
  for (size_t i = 0; i < hosts_of.size(); ++i) {
    ProcessSpec p;
    p.role = i < size_t(cfg.num_servers) ? Role::kServer : Role::kWorker;
    p.rank = p.role == Role::kServer ? int(i) : int(i) - cfg.num_servers;
    // Per-node mode: this node's share of the global ranks.
    if (cfg.nnodes > 0)
      p.rank += cfg.node_rank * (p.role == Role::kWorker ? cfg.num_workers : cfg.num_servers);
    p.host_index = hosts_of[i];
    if (cfg.hosts.empty()) {
      p.host = cfg.host_ip.empty() ? "127.0.0.1" : cfg.host_ip;
    } else {
      p.host = cfg.hosts[p.host_index].host;
      p.ssh_port = cfg.hosts[p.host_index].ssh_port;
    }
    p.local_rank = next[{p.host_index, p.role}]++;
    p.local_size = count[{p.host_index, p.role}];
    if (p.role == Role::kServer)
      p.argv = {"/bin/sh", "-c", "exec " + cfg.server_command};
    else
      p.argv = cfg.command;
    p.env = process_env(cfg, rv, p);
    // The process's index among the job's processes on its host: its
    // Prometheus port is PUSHPULL_METRICS_PORT + this (docs/timeline.md).
    p.env["PUSHPULL_HOST_PROCESS_INDEX"] = std::to_string(on_host[p.host_index]++);
    plan.push_back(std::move(p));
  }
  return plan;
}

}  // namespace pushpull::launch
