// SPDX-License-Identifier: Apache-2.0
#include "meet.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/format.h>

#include <sstream>
#include <string>
#include <vector>

#include "net/peer_policy.h"
#include "net/socket.h"
#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull::torch_pg {
namespace {

// Rank 0's rendezvous listener, bound (and listening) before its port is
// published in torch's store, and handed in-process to the Session's
// rendezvous (net::offer_listener): no other program can take the port in
// between. (A bound, non-listening SO_REUSEADDR reservation, as before, let
// another user bind the port too, with SO_REUSEADDR, and listen first.)
// Whatever happens to the Session, an untaken listener is closed.
class OfferedListener {
 public:
  explicit OfferedListener(const std::string& bind_host) {
    net::Fd fd = net::listen_on(bind_host, 0);
    port_ = net::local_port(fd.get());
    net::offer_listener(std::move(fd));
  }
  ~OfferedListener() { net::withdraw_offered_listener(); }
  OfferedListener(const OfferedListener&) = delete;
  OfferedListener& operator=(const OfferedListener&) = delete;
  int port() const { return port_; }

 private:
  int port_ = 0;
};

// The TCPStore under any PrefixStores, or nullptr.
c10d::TCPStore* tcp_store_of(c10d::Store* s) {
  for (int depth = 0; s != nullptr && depth < 16; ++depth) {
    if (auto* tcp = dynamic_cast<c10d::TCPStore*>(s)) return tcp;
    auto* prefix = dynamic_cast<c10d::PrefixStore*>(s);
    if (prefix == nullptr) return nullptr;
    s = prefix->getUnderlyingStore().get();
  }
  return nullptr;
}

// Where rank 0 hosts the rendezvous: an address the other ranks reach it at.
std::string meeting_host(const Options& o, c10d::Store* store) {
  if (!o.collective.master_addr.empty()) return o.collective.master_addr;
  if (auto* tcp = tcp_store_of(store)) return tcp->getHost();
  if (!o.net.node_host.empty()) return o.net.node_host;  // PUSHPULL_NODE_HOST / DMLC_NODE_HOST
  return "127.0.0.1";  // file:// or hash stores without any of the above: one host
}

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

}  // namespace

std::shared_ptr<collective::Session> meet(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                          int size) {
  Options o = Options::from_env();
  // The group is exactly the c10d group: no scheduler, its rank and size.
  o.cluster.role = Role::kNone;
  o.cluster.num_servers = 0;
  const bool whole_world = o.collective.size == size;
  o.collective.rank = rank;
  o.collective.size = size;
  if (!whole_world) {  // a subgroup: count local ranks among its members' hosts
    o.collective.local_rank = -1;
    o.collective.local_size = -1;
  }
  if (size == 1) {
    o.collective.master_addr.clear();
    o.collective.master_port = 0;
    return std::make_shared<collective::Session>(o);
  }

  std::unique_ptr<OfferedListener> reserved;
  if (rank == 0) {
    const std::string host = meeting_host(o, store.get());
    // Bound where the rendezvous would bind it (collective/rendezvous.cpp).
    reserved = std::make_unique<OfferedListener>(net::bind_host_for(host, o.net.bind_any));
    o.collective.master_addr = host;
    o.collective.master_port = reserved->port();
    store->set(kRendezvousKey, bytes(fmt::format("{} {}", host, reserved->port())));
  } else {
    try {
      store->wait({kRendezvousKey}, o.cluster.startup_timeout);
    } catch (const std::exception& e) {
      throw Timeout(fmt::format(
          "pushpull ProcessGroup: rank {} of {} waited {} ms for rank 0 to publish pushpull's "
          "rendezvous address in the torch.distributed store (key '{}'): {}; is rank 0 running "
          "and using the 'pushpull' backend too? (PUSHPULL_STARTUP_TIMEOUT_MS)",
          rank, size, o.cluster.startup_timeout.count(), kRendezvousKey, e.what()));
    }
    const std::vector<uint8_t> value = store->get(kRendezvousKey);
    std::istringstream in(std::string(value.begin(), value.end()));
    std::string host;
    int port = 0;
    if (!(in >> host >> port) || port <= 0 || port > 65535) {
      throw ProtocolError(fmt::format(
          "pushpull ProcessGroup: malformed rendezvous address '{}' in the store (key '{}')",
          std::string(value.begin(), value.end()), kRendezvousKey));
    }
    o.collective.master_addr = host;
    o.collective.master_port = port;
  }
  auto session = std::make_shared<collective::Session>(o);
  if (rank == 0) {
    try {
      store->deleteKey(kRendezvousKey);  // every rank has met: a later group starts afresh
    } catch (const std::exception&) {
      // Some stores cannot delete; a stale key is replaced by the next set().
    }
  }
  return session;
}

}  // namespace pushpull::torch_pg
