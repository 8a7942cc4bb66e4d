// SPDX-License-Identifier: Apache-2.0
// Ranks as threads in one process: an InProcessFabric connects `size`
// endpoints; a message is one memcpy from the sender's buffer straight into
// the receiver's posted destination, done by whichever side posts second
// (rendezvous: a send completes only once its receiver has taken it, which is
// stricter than TCP and so catches algorithms that rely on buffering).
//
// Closing an endpoint stands for a rank dying: its peers' operations with it
// fail with PeerFailure naming the rank.
//
// Ownership: endpoints share the fabric (it lives until the last endpoint is
// gone). Thread safety: all methods are safe from any thread.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace pushpull::transport {

class InProcessFabric {
 public:
  explicit InProcessFabric(int size);
  ~InProcessFabric();
  InProcessFabric(const InProcessFabric&) = delete;
  InProcessFabric& operator=(const InProcessFabric&) = delete;

  int size() const;
  // The endpoint of `rank` (call once per rank).
  std::unique_ptr<Transport> endpoint(int rank);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace pushpull::transport
