// Server: one parameter server of a job, on the network.
//
// It installs the PS message handlers on a cluster Node (a server node), feeds
// every request to its ServerStore and sends the store's answers back to the
// worker that asked. `pushpull server` and MXNet-style programs (role server
// calling create_kvstore("dist_...")) both run one with run_server().
//
// Threading: request decoding runs on the node's I/O thread and only queues
// work on the store's threads (KVStoreOptions::server_threads, default
// min(cores, 4)); answers are sent from those threads.
// Ownership: the Server borrows the Node, which must outlive it.
#pragma once

#include <memory>

#include "cluster/node.h"
#include "ps/server_store.h"

namespace pushpull::ps {

class Server : public ServerResponder {
 public:
  // Installs the handlers: call before node.start(). The mode (sync or async)
  // comes from worker 0's kSetMode command; until then the store is sync.
  explicit Server(cluster::Node& node);
  ~Server() override;

  void reply(const RequestMeta& to, const Status& status, DType dtype,
             std::span<const std::byte> data, std::shared_ptr<void> owner = nullptr) override;

 private:
  void on_message(net::Message&& m);
  void on_command(const RequestMeta& meta, net::Message&& m);
  void set_mode(bool sync);

  cluster::Node& node_;
  int threads_;
  std::mutex mu_;  // guards store_ replacement (set_mode before any key exists)
  std::shared_ptr<ServerStore> store_;
  std::shared_ptr<ServerStore> store() {
    std::lock_guard lock(mu_);
    return store_;
  }
};

// Runs a server node for the whole job: registers with the scheduler, serves
// until every node has left (or the job failed: throws its PeerFailure).
// `options.cluster.role` must be kServer.
void run_server(Options options);

}  // namespace pushpull::ps
