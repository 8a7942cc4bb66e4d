// SPDX-License-Identifier: Apache-2.0
// Hostfile parsing for `pushpull launch -H FILE`.
//
// Format, one host per line:   host[:sshport] [slots=K]
// `#` starts a comment; blank lines are ignored. IPv6 addresses go in
// brackets when a port follows ("[fe80::1]:2222").
//
// Thread safety: pure functions over values.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "pushpull/error.h"

namespace pushpull::launch {

struct HostEntry {
  std::string host;  // name or address, as ssh and the other nodes use it
  int ssh_port = 22;
  int slots = 0;  // 0: not given (as many as needed)

  bool operator==(const HostEntry&) const = default;
};

// Whether `host` can go on ssh's, rsync's or mpirun's command line: not
// empty, no leading '-', only letters, digits and . _ : - [ ] @ (and no '-'
// right after '@'). Returns InvalidArgument with why not.
Status check_host_name(std::string_view host);

// Parses hostfile text. `source` names it in messages (usually the path).
// Throws InvalidArgument naming the source and the 1-based line number of the
// first bad line (including a host name check_host_name refuses), and when no
// host is listed at all.
std::vector<HostEntry> parse_hostfile(std::string_view text, std::string_view source);

// Reads and parses the file at `path`. Throws InvalidArgument when it cannot
// be read (with the OS reason) or is malformed.
std::vector<HostEntry> read_hostfile(const std::string& path);

}  // namespace pushpull::launch
