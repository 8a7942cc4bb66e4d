// SPDX-License-Identifier: Apache-2.0
// Helpers of the launcher's multi-process tests: run `pushpull launch` (the
// test build of it) as a child with a deadline, capture its output, parse
// what the probes printed, and check that processes are gone.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace pushpull::launch::testing {

inline std::string bin(const std::string& name) {
  return std::string(PUSHPULL_BIN_DIR) + "/" + name;
}

// A temporary directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pp-launch-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    out.push_back(l);
  return out;
}

struct Result {
  int code = -1;  // exit code, or 128+signal
  std::string out, err;
};

// Starts the launcher; `on_start(pid, stdout_path)` may watch and signal it. Kills it (only it) and
// fails the test when it runs past `deadline`.
// `wrapper` goes before the launcher (e.g. ip netns exec NS).
template <typename OnStart>
Result run_launcher(const std::vector<std::string>& args, std::chrono::seconds deadline,
                    OnStart on_start, const std::string& cwd = "",
                    const std::vector<std::string>& wrapper = {}) {
  TempDir tmp;
  std::string out_path = tmp.path() + "/out", err_path = tmp.path() + "/err";
  std::vector<std::string> argv = wrapper;
  argv.insert(argv.end(), {bin("pushpull_launch_cli"), "launch"});
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv)
    cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(126);
    execvp(cargv[0], cargv.data());
    _exit(127);
  }
  Result r;
  if (pid < 0) return r;
  on_start(pid, out_path);
  auto until = std::chrono::steady_clock::now() + deadline;
  int status = 0;
  while (true) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "the launcher ran past " << deadline.count() << " s and was killed";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

inline Result run_launcher(const std::vector<std::string>& args,
                           std::chrono::seconds deadline = std::chrono::seconds(60),
                           const std::string& cwd = "") {
  return run_launcher(
      args, deadline, [](pid_t, const std::string&) {}, cwd);
}

// What each probe printed, by its "[label] " prefix.
struct ProbeReport {
  std::map<std::string, std::string> env;
  int pid = -1;
  std::string cwd;
  std::string options;
};

inline std::map<std::string, ProbeReport> parse_probes(const std::string& out) {
  std::map<std::string, ProbeReport> probes;
  for (const auto& line : lines_of(out)) {
    if (line.empty() || line[0] != '[') continue;
    auto close = line.find("] ");
    if (close == std::string::npos) continue;
    std::string label = line.substr(1, close - 1), body = line.substr(close + 2);
    auto& p = probes[label];
    if (body.starts_with("ENV ")) {
      auto eq = body.find('=');
      p.env[body.substr(4, eq - 4)] = body.substr(eq + 1);
    } else if (body.starts_with("PID ")) {
      p.pid = std::stoi(body.substr(4));
    } else if (body.starts_with("CWD ")) {
      p.cwd = body.substr(4);
    } else if (body.starts_with("OPTIONS ")) {
      p.options = body.substr(8);
    }
  }
  return probes;
}

// True when `pid` is gone or a zombie (an orphan not yet reaped by init).
inline bool process_gone(int pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

inline bool wait_gone(int pid, std::chrono::milliseconds within = std::chrono::milliseconds(3000)) {
  auto until = std::chrono::steady_clock::now() + within;
  while (!process_gone(pid)) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace pushpull::launch::testing
