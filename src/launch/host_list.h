// SPDX-License-Identifier: Apache-2.0
// `pushpull launch -H ARG`: a hostfile path (hostfile.h: host[:sshport]
// [slots=K] per line) or, as horovodrun's -H, an inline list
// "h1:2,h2:2" of host[:slots] (IPv6 in brackets: "[fe80::1]:2"). An inline
// list cannot give ssh ports; use a hostfile for those (docs/launch.md).
//
// Thread safety: pure functions (read_hosts reads the file system).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "launch/hostfile.h"

namespace pushpull::launch {

// Parses "h1:2,h2:2,h3" (slots 2, 2, not given). Throws InvalidArgument
// naming the bad entry.
std::vector<HostEntry> parse_host_list(std::string_view list);

// A file when `arg` names an existing file or contains '/'; otherwise an
// inline list. Throws InvalidArgument (unreadable or malformed).
std::vector<HostEntry> read_hosts(const std::string& arg);

}  // namespace pushpull::launch
