// SPDX-License-Identifier: Apache-2.0
// The host discovery script of an elastic job (`pushpull launch
// --host-discovery-script FILE`, as horovodrun's): an executable that prints
// the hosts that may run workers now, one `host:slots` line each (`host`
// alone: one slot). The launcher runs it every few seconds; hosts that appear
// get workers, hosts that vanish lose theirs.
//
// Thread safety: run_discovery blocks the calling thread (at most `timeout`);
// call it from the launcher's main thread (the script's death signal is tied
// to the thread that forks it).
#pragma once

#include <string>
#include <vector>

#include "launch/hostfile.h"
#include "pushpull/options.h"

namespace pushpull::launch {

// Parses the script's output: `host[:slots]` per line, blank lines and `#`
// comments ignored. Throws InvalidArgument naming the bad line.
std::vector<HostEntry> parse_discovery_output(const std::string& text);

// Runs `script` (through /bin/sh -c, so arguments may follow) and parses its
// output. Throws InvalidArgument when it cannot start, exits non-zero, runs
// longer than `timeout` (it is then killed) or prints something malformed.
std::vector<HostEntry> run_discovery(const std::string& script, Millis timeout);

}  // namespace pushpull::launch
