// SPDX-License-Identifier: Apache-2.0
// TransportConfig: what a MessageTransport (message_transport.h) is built
// with: the node's identity, the network options, and the switches of its
// same-host shared memory, lending, dead-link timeout and data streams.
//
// Thread safety: a plain value; the MessageTransport keeps its own copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "pushpull/options.h"
#include "transport/message.h"

namespace pushpull::transport {

struct TransportConfig {
  NetOptions net;
  Role role = Role::kNone;
  int32_t rank = -1;
  // Tests set another value to check version refusal.
  uint16_t protocol_version = kProtocolVersion;
  // Log label of the I/O thread, e.g. "worker 0".
  std::string label;
  // While this node's rank is -1 (a cluster node before the scheduler's
  // address book), hold incoming hellos and answer them once set_identity()
  // gives it a rank, so connectors learn a ranked, proven identity. Off: answer
  // at once with whatever identity is set.
  bool hold_hellos_until_ranked = false;
  // Same-host payloads through shared memory (message_transport.h, "Same host"). Both ends must
  // want it; the cluster's nodes set it from NetOptions::ps_shared_memory.
  bool shared_memory = false;
  // Received payloads of 256 KiB and more land in lendable memory
  // (transport/buffer_pool.h, transport/shm/lend.h), so the node can lend them on to a
  // same-host peer; the cluster's nodes set it from NetOptions::ps_lend.
  bool lend_buffers = false;
  // Bytes of each direction's ring (a multiple of 4 KiB, at least 64 KiB).
  size_t shm_ring_bytes = size_t{4} << 20;
  // Messages with at least this many payload bytes use the ring (> 0).
  size_t shm_min_payload = 1;
  // Where the segments live (tmpfs); tests point it elsewhere.
  std::string shm_dir = "/dev/shm";
  // A connection whose peer stops acknowledging (a silent link cut) closes
  // with "Connection timed out" after about this long (transport/socket.h,
  // set_dead_link_timeout): cluster nodes set their heartbeat timeout, so a
  // cut between two nodes that both still reach the scheduler is noticed as
  // soon as heartbeats notice anything else. Zero: the kernel's defaults.
  Millis dead_link_timeout{0};
  // Peers of rank [0, stream_ranks) may open one data stream each to this
  // node (message_transport.h, "Streams"); 0: none may.
  int32_t stream_ranks = 0;
};

}  // namespace pushpull::transport
