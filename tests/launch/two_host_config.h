// SPDX-License-Identifier: Apache-2.0
// The launch configuration several unit tests of the launcher build on
// (launch_plan_test.cpp, launch_commands_test.cpp): three workers and one
// server over ssh on two hosts, with variables for every role. Returns a
// fresh value on each call; no shared state.
#pragma once

#include "launch/plan.h"

namespace pushpull::launch {

inline LaunchConfig two_host_config() {
  LaunchConfig c;
  c.num_workers = 3;
  c.num_servers = 1;
  c.launcher = LauncherKind::kSsh;
  c.hosts = {{"a", 2200, 0}, {"b", 22, 0}};
  c.command = {"./train", "--lr", "0.1"};
  c.server_command = "pushpull server";
  c.host_ip = "10.0.0.1";
  c.job_id = "job7";
  c.timeout_s = 12;
  c.interface = "eth1";
  c.env = {{"A", "1"}};
  c.env_worker = {{"W", "2"}};
  c.env_server = {{"S", "3"}};
  return c;
}

}  // namespace pushpull::launch
