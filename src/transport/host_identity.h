// SPDX-License-Identifier: Apache-2.0
// Which "host" this process runs on, for deciding whether two processes may
// move data through shared memory: the kernel's boot id (host names repeat
// across containers), the host name, and the network and PID namespaces.
// Two network-namespace "hosts" of one kernel are separate hosts on purpose:
// they stand for machines, and the links between them are what such a setup
// measures (tests and `bench ... --netns`). Equal identities are necessary,
// not sufficient: the shared-memory setups still prove, by a token or a
// probe file, that both ends open the same segment directory.
//
// Thread safety: thread-safe. Read afresh at every call (a few small files):
// a process may enter another namespace after it started, and a forked
// child may make its own.
#pragma once

#include <string>

namespace pushpull::transport {

// "boot id|host name|net N|pid P", at most 160 bytes.
std::string host_identity();

// The key both shared-memory paths decide "same host, same user, same
// segment directory" by: host_identity(), the device and inode of `dir` (a
// private /dev/shm differs) and the effective uid. The collectives trade it
// in their host records (transport/shm/shm_host.h), the PS in its shared-memory
// offer (transport/shm/shm_setup.h).
std::string host_key(const std::string& dir);

// "device:inode" of `path`, "?" when it cannot be stat()ed.
std::string inode_of(const std::string& path);

}  // namespace pushpull::transport
