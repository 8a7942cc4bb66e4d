// SPDX-License-Identifier: Apache-2.0
// Test program for the parameter-server fault tests: a dist_sync worker that
// pushes and pulls one key in a loop until told to stop (a file appears) or
// until a deadline, then exits 0. On an error it prints "ERROR <type>: <msg>"
// and exits 3, so the test can check which failure every worker saw.
#include <fmt/format.h>
#include <chrono>
#include <filesystem>
#include <thread>

#include "pushpull/error.h"
#include "pushpull/kvstore.h"

int main(int argc, char** argv) {
  std::string stop_file = argc > 1 ? argv[1] : "";
  try {
    auto options = pushpull::Options::from_env();
    pushpull::set_log_level(options.log_level);
    auto kv = pushpull::create_kvstore("dist_sync", options);
    pushpull::Array w = pushpull::Array::full(pushpull::Shape{1000}, 0.0);
    kv->init(1, w.view());
    fmt::print("READY worker {}\n", kv->rank());
    std::fflush(stdout);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    pushpull::Array g = pushpull::Array::full(pushpull::Shape{1000}, 1.0);
    int rounds = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!stop_file.empty() && std::filesystem::exists(stop_file)) break;
      kv->pushpull(1, g.view(), w.view());
      ++rounds;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    fmt::print("DONE worker {} after {} rounds\n", kv->rank(), rounds);
  } catch (const pushpull::Error& e) {
    fmt::print("ERROR {}: {}\n", pushpull::error_code_name(e.code()), e.what());
    std::fflush(stdout);
    return 3;
  }
  return 0;
}
