// SPDX-License-Identifier: Apache-2.0
// The transport of a job whose ranks all share one host: engine control
// traffic (tags with kControlTagBit) and the failure detector stay on the
// TcpTransport; collective data (every other tag) goes through shared memory
// (ShmTransport). A verdict of the TCP mesh (a peer dead or stopped, the
// job's first failure) also fails the shared-memory operations with it, so
// the blame is the same as over TCP alone.
//
// use_shared_memory() is what the bootstrap calls: with PUSHPULL_SHM=1 and
// every rank of the address book on this rank's host it agrees on a segment
// name over the TCP mesh (rank 0's random token) and returns the layered
// transport; otherwise it returns the TCP transport unchanged. (Opt-in for
// now: the fault-injection suite has not run with it yet.)
//
// Ownership: owns both transports. Thread safety: as Transport.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collective/shm_transport.h"
#include "collective/tcp_transport.h"

namespace pushpull::collective {

class ShmDataTransport final : public Transport {
 public:
  ShmDataTransport(std::unique_ptr<TcpTransport> tcp, std::unique_ptr<ShmTransport> shm);
  ~ShmDataTransport() override;

  int rank() const override { return tcp_->rank(); }
  int size() const override { return tcp_->size(); }
  void post_send(int peer, uint64_t tag, const void* data, size_t bytes, Completion done) override;
  void post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) override;
  void close(const Status& reason) override;
  void abort(const Status& why) override;
  TcpTransport& tcp() { return *tcp_; }

 private:
  std::unique_ptr<TcpTransport> tcp_;
  std::shared_ptr<ShmTransport> shm_;
};

// See above; `enabled` is Options' collective.shared_memory. `startup` bounds the agreement and the
// segments' setup.
std::unique_ptr<Transport> use_shared_memory(std::unique_ptr<TcpTransport> tcp,
                                             const std::vector<std::pair<std::string, int>>& book,
                                             bool enabled, Millis startup);

}  // namespace pushpull::collective
