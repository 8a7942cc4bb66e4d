// SPDX-License-Identifier: Apache-2.0
// The worker's side of the elastic rendezvous (protocol: elastic_protocol.h;
// server: elastic_rendezvous.h), and the bootstrap of an elastic round.
//
// A worker started by `pushpull launch --min-workers/--max-workers` has
//   PUSHPULL_ELASTIC_ADDR=host:port   where the launcher's server listens
//   PUSHPULL_ELASTIC_ID=<id>          this worker's id in the job
// (plus the job id and secret). Each Session it builds (collective::init()
// after every re-formation) asks the server for a place in the next round
// and connects that round's mesh (bootstrap_elastic). The connection to the
// server lasts the whole process, so it lives in a process-wide client that
// exists from the first elastic Session on: the one other global of the
// collective layer, for the same reason as the default session (Horovod's
// elastic API is module-level); it is never created outside an elastic job.
//
// What the server says between rounds: a member of the current round died
// (the client declares that on the round's mesh, so pending operations fail
// at once rather than after the heartbeat timeout) and host changes (a
// stamp that State::check_host_updates / Python's elastic state read).
// If the connection to the launcher closes, the launcher is gone: every
// later join throws Internal (not a member failure: the job cannot re-form
// without its launcher, so the elastic loop ends).
//
// Thread safety: every method is thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "collective/bootstrap.h"
#include "collective/elastic_protocol.h"
#include "pushpull/options.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::collective::elastic {

using transport::VerdictPort;

struct ClientConfig {
  NetOptions net;
  std::string server_host;
  int server_port = 0;
  std::string worker_id;
};

// From PUSHPULL_ELASTIC_ADDR / PUSHPULL_ELASTIC_ID (+ options.net); nullopt
// when PUSHPULL_ELASTIC_ADDR is unset; InvalidArgument when malformed.
std::optional<ClientConfig> client_config_from_env(const Options& options);

class Client {
 public:
  explicit Client(ClientConfig config);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Asks for a place in the next round, with this process's mesh listener
  // at host:port; blocks until assigned or `timeout`. Throws what the server
  // declined with (its error code), PeerFailure when the launcher is gone,
  // Timeout.
  Assignment join(const std::string& host, int port, Millis timeout);
  // The mesh of round `round`: a member-gone notice for that round is
  // declared on it.
  void attach(uint64_t round, std::shared_ptr<VerdictPort> port);
  // The newest host-change stamp announced, and the one the current round
  // already includes (a change is pending when the first is larger).
  uint64_t hosts_stamp() const;
  uint64_t round_hosts_stamp() const;
  uint64_t round() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The process-wide client of an elastic job (created on first use from the
// environment); nullptr when this process is not an elastic worker.
Client* process_client(const Options& options);
// The process-wide client if one exists (no creation).
Client* existing_process_client();

// Sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (and their PUSHPULL_
// twins), HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK and
// _CROSS_SIZE to this process's place in round `a` (setenv: call it only
// where no other thread reads the environment; bootstrap_elastic does, before
// the round's mesh starts its threads).
void publish_round_env(const Assignment& a);

// Builds this process's transport for the next round (bootstrap.h's mode
// kElastic), after publish_round_env. Blocks up to the launcher's
// --elastic-timeout.
Bootstrapped bootstrap_elastic(const Options& options);

}  // namespace pushpull::collective::elastic
