// SPDX-License-Identifier: Apache-2.0
// The transport of a job some of whose ranks share a host: engine control
// traffic (tags with kControlTagBit) and the failure detector stay on the
// TcpTransport; collective data (every other tag) between two ranks of one
// host group goes through shared memory (ShmTransport over the group), and
// data to every other rank over TCP. A verdict of the TCP mesh (a peer dead
// or stopped, the job's first failure) also fails the shared-memory
// operations with it, so the blame is the same as over TCP alone; a rank
// that dies or stops is found by the mesh's heartbeats and closed
// connections, and the shared-memory waits (futex with a timeout, the peers'
// pids checked) never outlast it.
//
// use_shared_memory() is what the bootstrap calls (default on;
// PUSHPULL_SHM=0 turns it off): the ranks exchange host records over the
// mesh (shm_host.h: boot id, host name, namespaces, a probe file each must
// see), find the groups of ranks that can really share memory, and build
// one ShmTransport per group of two or more (each rank's segment named by
// its own random 128-bit token, created O_EXCL | O_NOFOLLOW, 0600). A group
// whose segments cannot be made or mapped (a name squatted, a file refused,
// no room) falls back to TCP together, with one warning line; it never fails
// the job. Without any such group the TCP transport is returned unchanged.
//
// Ownership: owns both transports. Thread safety: as Transport.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::transport {

class ShmDataTransport final : public Transport {
 public:
  // `group`: the job's ranks served by `shm` (ascending, this rank among
  // them); rank group[i] is rank i of `shm`. A null `shm` with an empty
  // group: a rank alone on its host in a job where others share memory
  // (everything over TCP, but no direct streams, like the others). Direct
  // streams are never offered: every rank of an operation must take the
  // same path (a mixed job uses post_send/recv throughout, but for the
  // operations of small messages, see set_stream_below).
  ShmDataTransport(std::unique_ptr<TcpTransport> tcp, std::unique_ptr<ShmTransport> shm,
                   std::vector<int> group);
  ~ShmDataTransport() override;

  int rank() const override { return tcp_->rank(); }
  int size() const override { return tcp_->size(); }
  void post_send(int peer, uint64_t tag, const void* data, size_t bytes, Completion done) override;
  void post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) override;
  void close(const Status& reason) override;
  void abort(const Status& why) override;
  // Operations whose messages are below set_stream_below()'s on the TCP mesh's
  // direct streams (when it has them), the others with post_send/post_recv.
  void run(const Schedule& s) override;
  bool streams_for(size_t message_bytes) const;
  // The shared-memory arena when every rank of the job is in this host
  // group (the whole job on one host), else nullptr.
  HostCollectives* host_collectives() override;
  // Operations whose messages are all below `bytes` run on the TCP mesh's
  // direct streams, driven by the algorithm's thread (a few microseconds a
  // message, where a shared-memory message crosses two progress threads);
  // 0: every data message through shared memory. Set before the first
  // operation; the same on every rank (an option).
  void set_stream_below(uint64_t bytes) { stream_below_ = bytes; }
  // This rank's host group (the job's ranks reached through shared memory).
  const std::vector<int>& group() const { return group_; }

 private:
  // peer's rank in shm_, or -1 (data over TCP).
  int local(int peer) const;

  std::unique_ptr<TcpTransport> tcp_;
  std::shared_ptr<ShmTransport> shm_;
  std::vector<int> group_;
  std::vector<int> local_;  // by the job's rank
  uint64_t stream_below_ = 0;
};

// A test seam: called on every rank of a group just before the segments
// are made, with its index in the group and the group's segment file names
// under `dir`, so a test can create them first as a squatter who could
// predict them would. Never set outside tests.
using SegmentsHook = std::function<void(int me, const std::vector<std::string>& names)>;

// See above. From `c`: shared_memory (on or off), shm_min_message_bytes (see
// ShmDataTransport::set_stream_below).
// `startup` bounds the exchange and the segments' setup. `dir` is where the segments live.
std::unique_ptr<Transport> use_shared_memory(std::unique_ptr<TcpTransport> tcp,
                                             const CollectiveOptions& c, Millis startup,
                                             const std::string& dir = "/dev/shm",
                                             const SegmentsHook& before_segments = {});

}  // namespace pushpull::transport
