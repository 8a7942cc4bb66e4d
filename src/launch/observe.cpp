// SPDX-License-Identifier: Apache-2.0
// The job's timeline merge and clock service, and the flight recorder note
// (see observe.h).
#include "launch/observe.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/private_file.h"
#include "base/timeline.h"
#include "launch/commands.h"
#include "launch/launcher.h"
#include "launch/supervisor.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

namespace pushpull::launch {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The value of `name` the job's processes see: --env (then --env-worker),
// else the launcher's environment.
std::string job_var(const LaunchConfig& cfg, const Environment& env, std::string_view name) {
  for (const EnvList* list : {&cfg.env, &cfg.env_worker})
    for (auto it = list->rbegin(); it != list->rend(); ++it)
      if (it->first == name) return it->second;
  return env.get(name).value_or("");
}

// `path` as the processes see it: relative to the job's working directory.
std::string in_workdir(const LaunchConfig& cfg, const std::string& path) {
  return path.empty() || path.front() == '/' || cfg.workdir.empty() ? path
                                                                    : cfg.workdir + "/" + path;
}

// One file's events; a file cut short keeps its whole events (one per line).
std::vector<json> read_events(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  json all = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (all.is_array()) return all.get<std::vector<json>>();
  std::vector<json> events;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    while (!line.empty() && (line.back() == ',' || line.back() == ' '))
      line.pop_back();
    if (line.empty() || line == "[" || line == "]") continue;
    json e = json::parse(line, nullptr, false);
    if (e.is_discarded()) break;
    events.push_back(std::move(e));
  }
  return events;
}

}  // namespace

std::string timeline_base(const LaunchConfig& cfg, const Environment& env) {
  std::string base = job_var(cfg, env, "PUSHPULL_TIMELINE");
  return base.empty() ? job_var(cfg, env, "HOROVOD_TIMELINE") : base;
}

JobTimeline::JobTimeline(LaunchConfig& cfg, const Environment& env)
    : base_(timeline_base(cfg, env)) {
  if (base_.empty()) return;
  try {
    clock_ = std::make_unique<base::ClockService>();
    const std::string host = cfg.bind_any ? "" : cfg.host_ip;
    const int port = clock_->start(host);
    cfg.env.emplace_back("PUSHPULL_TIMELINE_CLOCK", fmt::format("{}:{}", cfg.host_ip, port));
  } catch (const Error& e) {
    PP_WARN("{}: the merged timeline's hosts stay unaligned", e.what());
    clock_.reset();
  }
}

JobTimeline::~JobTimeline() = default;

size_t merge_timeline_files(const std::vector<std::string>& files, const std::string& out) {
  std::string text = "[\n";
  size_t n = 0;
  for (size_t k = 0; k < files.size(); ++k) {
    std::vector<json> events = read_events(files[k]);
    double offset_us = 0;
    for (const json& e : events)
      if (e.value("name", "") == "pushpull_clock_offset" && e.contains("args"))
        offset_us = e["args"].value("offset_us", 0.0);
    for (json& e : events) {
      if (e.value("name", "") == "pushpull_clock_offset") continue;
      if (e.contains("pid") && e["pid"].is_number_integer())
        e["pid"] = static_cast<int64_t>((k + 1) * 1000) + e["pid"].get<int64_t>();
      if (e.contains("ts") && e["ts"].is_number()) e["ts"] = e["ts"].get<double>() + offset_us;
      text += n++ ? ",\n" : "";
      text += e.dump();
    }
  }
  text += "\n]\n";
  base::write_private_file(out, text, "merged timeline", /*durable=*/false);
  return n;
}

void JobTimeline::merge(SignalGuard& signals, const LaunchConfig& cfg,
                        const std::vector<ProcessSpec>& plan) {
  if (base_.empty()) return;
  clock_.reset();  // every process measured at its start
  // F as the launcher sees it (relative: to its working directory), and as
  // the processes do (relative: to the job's working directory).
  const std::string merged = base_;
  const std::string there = in_workdir(cfg, base_);
  std::string stem = there;
  if (stem.size() > 5 && stem.ends_with(".json")) stem.resize(stem.size() - 5);
  try {
    // ssh hosts: their files, fetched over the same ssh as --sync-dst-dir.
    std::map<size_t, std::string> fetched;  // host index -> local folder
    const bool remote = cfg.launcher == LauncherKind::kSsh && !cfg.hosts.empty();
    std::string scratch;
    if (remote) {
      scratch = merged + ".fetch";
      base::make_private_dirs(scratch, "timeline fetch folder");
      std::set<size_t> hosts;
      for (const auto& p : plan)
        hosts.insert(p.host_index);
      for (size_t h : hosts) {
        if (is_loopback_host(cfg.hosts[h].host)) continue;
        const std::string dst = fmt::format("{}/{}", scratch, h);
        base::make_private_dirs(dst, "timeline fetch folder");
        const std::string pattern = stem + ".*.json";
        ChildSpec s;
        s.label = "fetch timeline " + cfg.hosts[h].host;
        s.argv = rsync_fetch_argv(cfg, cfg.hosts[h], pattern, dst);
        const Environment now = Environment::current();
        for (const auto& [k, v] : now.vars())
          s.env.push_back(k + "=" + v);
        SupervisorSettings st;
        st.grace = Millis(int64_t(cfg.grace_s * 1000));
        if (supervise(signals, {std::move(s)}, st).exit_code == 0)
          fetched[h] = dst;
        else
          PP_WARN("timeline: could not fetch {}'s files ({}); merging without them",
                  cfg.hosts[h].host, pattern);
      }
    }
    std::vector<std::string> files;
    std::vector<std::string> missing;
    for (const auto& p : plan) {
      const std::string name = timeline::process_file_name(there, role_name(p.role), p.rank);
      std::string path = name;
      if (auto it = fetched.find(p.host_index); it != fetched.end()) {
        const std::string copy = it->second + "/" + fs::path(name).filename().string();
        if (fs::exists(copy)) path = copy;
      }
      if (fs::exists(path))
        files.push_back(path);
      else
        missing.push_back(p.label());
    }
    if (files.empty()) {
      PP_WARN("timeline: no process wrote its file next to {}; nothing merged", merged);
      return;
    }
    const size_t n = merge_timeline_files(files, merged);
    if (!scratch.empty()) fs::remove_all(scratch);
    PP_INFO("timeline: merged {} files ({} events) into {}{}", files.size(), n, merged,
            missing.empty() ? "" : fmt::format(" (no file from {})", fmt::join(missing, ", ")));
  } catch (const std::exception& e) {
    PP_WARN("timeline: merging into {} failed: {}", merged, e.what());
  }
}

std::string flight_recorder_note(const LaunchConfig& cfg, const Environment& env,
                                 const std::vector<ProcessSpec>& plan, fs::file_time_type since) {
  std::string dir = job_var(cfg, env, "PUSHPULL_FLIGHT_RECORDER_DIR");
  if (job_var(cfg, env, "PUSHPULL_FLIGHT_RECORDER_SIZE") == "0") return {};
  dir = dir.empty() ? cfg.workdir : in_workdir(cfg, dir);
  if (!cfg.hosts.empty())
    return fmt::format(
        "\n  flight recorder dumps (if any): {}/pushpull-flight.<role><rank>.json on "
        "each process's host",
        dir);
  std::vector<std::string> found;
  for (const auto& p : plan) {
    const std::string f =
        fmt::format("{}/pushpull-flight.{}{}.json", dir, role_name(p.role), p.rank);
    std::error_code ec;
    if (fs::exists(f, ec) && fs::last_write_time(f, ec) >= since) found.push_back(f);
  }
  if (found.empty()) return {};
  return fmt::format("\n  flight recorder dumps: {}", fmt::join(found, ", "));
}

}  // namespace pushpull::launch
