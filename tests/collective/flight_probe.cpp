// SPDX-License-Identifier: Apache-2.0
// A rank of the flight recorder test (tests/collective/flight_recorder_job_test.py):
// every rank allreduces "warmup.0" and "warmup.1"; then rank --hang R
// prints "HANGING pid=<pid>" and never calls the next allreduce (it sleeps,
// 60 s at most, exit 6), while the others allreduce "grad.stuck" and wait
// for it until the stall shutdown fails it ("ERROR <what>", exit 3).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "pushpull/collective.h"
#include "pushpull/error.h"

namespace cl = pushpull::collective;

int main(int argc, char** argv) {
  int hang = 1;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--hang") hang = std::stoi(argv[i + 1]);
  try {
    cl::init();
    pushpull::Array a = pushpull::Array::full(pushpull::Shape{256}, 1.0);
    cl::allreduce("warmup.0", a.view());
    cl::allreduce("warmup.1", a.view());
    if (hang < 0) {
      // A normal end, ranks closing at different moments: rank 0 first,
      // the others idle until its goodbye has arrived.
      if (cl::rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
      cl::shutdown();
      fmt::print("FINISHED\n");
      return 0;
    }
    if (cl::rank() == hang) {
      fmt::print("HANGING pid={}\n", ::getpid());
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 6;
    }
    cl::allreduce("grad.stuck", a.view());
    fmt::print("DONE (the stall was not detected)\n");
    return 5;
  } catch (const pushpull::Error& e) {
    fmt::print("ERROR {}\n", e.what());
    std::fflush(stdout);
    cl::shutdown();
    return 3;
  }
}
