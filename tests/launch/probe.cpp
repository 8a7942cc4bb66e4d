// SPDX-License-Identifier: Apache-2.0
// launch_probe: a test program for `pushpull launch`. It reports what the
// launcher gave it and can be told to fail in the ways the tests need.
//
//   --print-env        print "ENV NAME=VALUE" for the launcher's variables,
//                      then "PID <pid>", "CWD <dir>" and the ranks that
//                      Options::from_env derives ("OPTIONS role=.. rank=..").
//   --lines K --width W  print K lines of W characters in small pieces
//                      (to provoke mid-line interleaving if it could happen)
//   --fail-rank R      only worker R runs the failure action below
//   --fail-after S     the failing process waits S seconds first
//   --exit N           exit with N (after the rest)
//   --kill SIG         kill itself with signal SIG
//   --sleep S          sleep S seconds before exiting (the others, with --fail-rank)
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

#include "pushpull/options.h"

namespace {

void write_str(std::string_view s) {
  while (!s.empty()) {
    ssize_t n = write(1, s.data(), s.size());
    if (n <= 0) return;
    s.remove_prefix(size_t(n));
  }
}

bool launcher_var(const std::string& k) {
  for (const char* p : {"DMLC_", "PUSHPULL_", "OMPI_COMM_WORLD_"})
    if (k.starts_with(p)) return true;
  for (const char* n :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "PROBE_EXTRA", "PROBE_SERVER_ONLY", "PROBE_WORKER_ONLY", "SSH_CONNECTION"})
    if (k == n) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  bool print_env = false;
  int lines = 0, width = 0, fail_rank = -1, exit_code = 0, kill_sig = 0;
  double sleep_s = 0, fail_after_s = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string("0"); };
    if (a == "--print-env")
      print_env = true;
    else if (a == "--lines")
      lines = std::atoi(next().c_str());
    else if (a == "--width")
      width = std::atoi(next().c_str());
    else if (a == "--fail-rank")
      fail_rank = std::atoi(next().c_str());
    else if (a == "--exit")
      exit_code = std::atoi(next().c_str());
    else if (a == "--kill")
      kill_sig = std::atoi(next().c_str());
    else if (a == "--sleep")
      sleep_s = std::atof(next().c_str());
    else if (a == "--fail-after")
      fail_after_s = std::atof(next().c_str());
    else {
      std::fprintf(stderr, "launch_probe: unknown argument %s\n", a.c_str());
      return 64;
    }
  }
  auto env = pushpull::Environment::current();
  auto opts = pushpull::Options::from_env(env);
  std::string out;
  if (print_env) {
    for (const auto& [k, v] : env.vars())
      if (launcher_var(k)) out += "ENV " + k + "=" + v + "\n";
    char cwd[4096] = "";
    if (!getcwd(cwd, sizeof cwd)) std::strcpy(cwd, "?");
    out += "PID " + std::to_string(getpid()) + "\n";
    out += "CWD " + std::string(cwd) + "\n";
    out += "OPTIONS role=" + std::string(pushpull::role_name(opts.cluster.role)) +
           " rank=" + std::to_string(opts.collective.rank) +
           " size=" + std::to_string(opts.collective.size) +
           " local_rank=" + std::to_string(opts.collective.local_rank) + "\n";
    write_str(out);
  } else {
    write_str("PID " + std::to_string(getpid()) + "\n");
  }
  // Long lines written in small pieces with pauses, so a concurrent writer
  // gets every chance to land in the middle of one.
  char mark = char('a' + (opts.collective.rank >= 0 ? opts.collective.rank % 26 : 25));
  for (int l = 0; l < lines; ++l) {
    std::string line(size_t(width), mark);
    line += '\n';
    for (size_t off = 0; off < line.size(); off += 512) {
      write_str(std::string_view(line).substr(off, 512));
      if (off % 4096 == 0) std::this_thread::yield();
    }
  }
  bool chosen = fail_rank < 0 ||
                (opts.cluster.role == pushpull::Role::kWorker && opts.collective.rank == fail_rank);
  if (!chosen || (kill_sig == 0 && exit_code == 0)) {
    if (sleep_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
    return 0;
  }
  if (fail_after_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(fail_after_s));
  if (kill_sig) raise(kill_sig);
  return exit_code;
}
