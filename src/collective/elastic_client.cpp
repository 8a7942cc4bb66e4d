// SPDX-License-Identifier: Apache-2.0
#include "collective/elastic_client.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "base/flight_recorder.h"
#include "base/metrics.h"
#include "base/rank_environment.h"
#include "base/timeline.h"
#include "pushpull/elastic.h"
#include "pushpull/log.h"
#include "transport/peer_policy.h"
#include "transport/shm/shm_data_transport.h"
#include "transport/socket.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::collective::elastic {

using transport::TcpTransport;
using transport::VerdictPort;

struct Client::Impl {
  explicit Impl(ClientConfig c) : cfg(std::move(c)), net(transport_config(cfg)) {}

  static transport::TransportConfig transport_config(const ClientConfig& c) {
    transport::TransportConfig t;
    t.net = c.net;
    t.role = Role::kWorker;
    t.rank = -1;
    t.label = fmt::format("elastic worker {}", c.worker_id);
    return t;
  }

  ClientConfig cfg;
  transport::MessageTransport net;
  transport::ConnId conn{};
  mutable std::mutex mu;
  std::condition_variable cv;
  std::optional<Assignment> assigned;
  std::optional<Status> declined;
  std::optional<Status> gone;  // the launcher's connection closed
  uint64_t stamp = 0, round_stamp = 0, round = 0;
  std::shared_ptr<VerdictPort> mesh;
  uint64_t mesh_round = 0;
  // A member of a round died before this worker attached its mesh: kept for
  // attach(), so the mesh does not wait for that member until its timeout.
  std::optional<std::pair<uint64_t, Status>> early_gone;
  bool waiting = false;
};

Client::Client(ClientConfig config) : impl_(std::make_shared<Impl>(std::move(config))) {
  Impl& s = *impl_;
  std::weak_ptr<Impl> weak = impl_;
  s.net.set_handler(kAssignType, kHostsType, [weak](transport::Message&& m) {
    auto self = weak.lock();
    if (!self) return;
    std::unique_lock lock(self->mu);
    switch (m.header.type) {
      case kAssignType: {
        Assignment a;
        if (Status d = decode(m.payload.data(), m.payload.size(), &a); !d.is_ok()) {
          self->declined = d;
        } else {
          self->assigned = std::move(a);
        }
        self->cv.notify_all();
        return;
      }
      case kDeclineType: {
        std::string why(reinterpret_cast<const char*>(m.payload.data()),
                        std::min<size_t>(m.payload.size(), 4096));
        auto code = static_cast<ErrorCode>(m.header.flags);
        // A decline ends the elastic loop: never a member failure.
        if (code == ErrorCode::kPeerFailure || code == ErrorCode::kOk) code = ErrorCode::kInternal;
        self->declined = Status(code, why);
        self->cv.notify_all();
        return;
      }
      case kMemberGoneType: {
        MemberGone g;
        if (!decode(m.payload.data(), m.payload.size(), &g).is_ok()) return;
        if (!self->mesh || g.round != self->mesh_round) {
          if (g.round >= self->round)
            self->early_gone.emplace(g.round, Status(ErrorCode::kPeerFailure, g.why));
          return;
        }
        auto port = self->mesh;
        lock.unlock();
        port->deliver(Status(ErrorCode::kPeerFailure, g.why));
        return;
      }
      case kHostsType: {
        uint64_t stamp = 0;
        if (!decode_stamp(m.payload.data(), m.payload.size(), &stamp).is_ok()) return;
        self->stamp = std::max(self->stamp, stamp);
        return;
      }
      default:
        return;
    }
  });
  s.net.set_close_handler([weak](transport::ConnId, const transport::PeerInfo&, const Status& why) {
    auto self = weak.lock();
    if (!self) return;
    std::unique_lock lock(self->mu);
    self->gone = Status(ErrorCode::kInternal,
                        fmt::format("elastic: the connection to the launcher's rendezvous at "
                                    "{}:{} closed ({}); the launcher is gone",
                                    self->cfg.server_host, self->cfg.server_port, why.message()));
    self->cv.notify_all();
    auto port = self->mesh;
    lock.unlock();
    if (port) port->deliver(Status(ErrorCode::kPeerFailure, self->gone->message()));
  });
  s.net.start();
  s.conn = s.net.connect(s.cfg.server_host, s.cfg.server_port);
}

Client::~Client() {
  impl_->net.stop();
}

Assignment Client::join(const std::string& host, int port, Millis timeout) {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    if (s.gone) throw Internal(s.gone->message());
    s.assigned.reset();
    s.declined.reset();
    s.mesh.reset();
    s.early_gone.reset();
  }
  auto req = encode(JoinRequest{s.cfg.worker_id, host, port});
  if (Status st =
          s.net.send_copy(s.conn, transport::Header{.type = kJoinType}, req.data(), req.size());
      !st.is_ok())
    throw Internal(
        fmt::format("elastic: cannot reach the launcher's rendezvous: {}", st.message()));
  std::unique_lock lock(s.mu);
  bool ok = s.cv.wait_for(lock, timeout, [&] { return s.assigned || s.declined || s.gone; });
  if (s.declined) s.declined->raise();
  if (s.assigned) {
    Assignment a = std::move(*s.assigned);
    s.assigned.reset();
    s.round = a.round;
    s.round_stamp = a.hosts_stamp;
    s.stamp = std::max(s.stamp, a.hosts_stamp);
    return a;
  }
  if (s.gone) throw Internal(s.gone->message());
  (void)ok;
  throw Timeout(
      fmt::format("elastic: worker {} waited {} ms for a place in a round "
                  "(--elastic-timeout); too few workers?",
                  s.cfg.worker_id, timeout.count()));
}

void Client::attach(uint64_t round, std::shared_ptr<VerdictPort> port) {
  std::unique_lock lock(impl_->mu);
  if (round != impl_->round) return;
  impl_->mesh = port;
  impl_->mesh_round = round;
  if (!impl_->early_gone || impl_->early_gone->first != round) return;
  Status why = impl_->early_gone->second;
  lock.unlock();
  port->deliver(why);
}

uint64_t Client::hosts_stamp() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stamp;
}
uint64_t Client::round_hosts_stamp() const {
  std::lock_guard lock(impl_->mu);
  return impl_->round_stamp;
}
uint64_t Client::round() const {
  std::lock_guard lock(impl_->mu);
  return impl_->round;
}

std::optional<ClientConfig> client_config_from_env(const Options& options) {
  const std::string& a = options.collective.elastic_addr;
  if (a.empty()) return std::nullopt;
  ClientConfig c;
  c.net = options.net;
  auto colon = a.rfind(':');
  int port = 0;
  if (colon != std::string::npos) port = std::atoi(a.c_str() + colon + 1);
  if (colon == std::string::npos || colon == 0 || port <= 0 || port > 65535)
    throw InvalidArgument(
        fmt::format("PUSHPULL_ELASTIC_ADDR='{}' is not host:port (set by `pushpull launch "
                    "--min-workers/--max-workers`)",
                    a));
  c.server_host = a.substr(0, colon);
  c.server_port = port;
  if (options.collective.elastic_id.empty())
    throw InvalidArgument("PUSHPULL_ELASTIC_ADDR is set but PUSHPULL_ELASTIC_ID is not");
  c.worker_id = options.collective.elastic_id;
  return c;
}

namespace {

struct Slot {
  std::mutex mu;
  std::unique_ptr<Client> client;
};
Slot& slot() {
  static Slot s;
  return s;
}

}  // namespace

Client* process_client(const Options& options) {
  Slot& s = slot();
  std::lock_guard lock(s.mu);
  if (!s.client) {
    auto cfg = client_config_from_env(options);
    if (!cfg) return nullptr;
    s.client = std::make_unique<Client>(std::move(*cfg));
  }
  return s.client.get();
}

Client* existing_process_client() {
  Slot& s = slot();
  std::lock_guard lock(s.mu);
  return s.client.get();
}

bool is_elastic_worker(const Options& options) {
  return !options.collective.elastic_addr.empty();
}
uint64_t announced_hosts_stamp() {
  Client* c = existing_process_client();
  return c ? c->hosts_stamp() : 0;
}
uint64_t round_hosts_stamp() {
  Client* c = existing_process_client();
  return c ? c->round_hosts_stamp() : 0;
}
uint64_t current_round() {
  Client* c = existing_process_client();
  return c ? c->round() : 0;
}

void publish_round_env(const Assignment& a) {
  // The observers read the environment once, at first use: let them read it
  // now, as the launcher set it (their files keep this process's first
  // name, not a rank a later worker may have too), so that no other thread
  // reads it from here on.
  (void)timeline::enabled();
  (void)timeline::process_node();
  metrics::start_from_env();
  flight::start_from_env();
  std::vector<std::string> hosts;
  for (const auto& [h, p] : a.book)
    hosts.push_back(h);
  const auto [local_rank, local_size] = local_of(hosts, a.rank);
  const int size = a.size();
  for (const auto& [name, value] : round_variables(a.rank, size, local_rank, local_size))
    ::setenv(name, value.c_str(), 1);
}

Bootstrapped bootstrap_elastic(const Options& o) {
  Client* client = process_client(o);
  if (client == nullptr) throw InvalidArgument("elastic bootstrap without PUSHPULL_ELASTIC_ADDR");
  auto cfg = client_config_from_env(o);
  const std::string host = mesh_host(o, cfg->server_host);
  // The mesh's listener, bound (and held) before joining: the round's book
  // must name its port before the mesh, whose rank it fixes, exists, and no
  // other program may take the port in between.
  const std::string bind_host = transport::bind_host_for(host, o.net.bind_any);
  transport::Fd listener = transport::listen_on(bind_host, 0);
  const int port = transport::local_port(listener.get());
  Assignment a = client->join(host, port, o.collective.elastic_timeout);
  PP_INFO("elastic: worker {} is rank {} of {} in round {}", cfg->worker_id, a.rank, a.size(),
          a.round);
  // The round's ranks in the environment, as a fixed job's launcher sets them.
  // setenv is not thread-safe: here, on the thread that calls init(), the old
  // round's threads are gone and this round's mesh has none yet; no other
  // pushpull thread reads the environment (Options::from_env runs before, on
  // this thread).
  publish_round_env(a);
  NetOptions mesh = mesh_net(o);
  mesh.job_id = round_job_id(o.net.job_id, a.round);
  // Every member of the round is running already: connecting is quick, and
  // a member that died meanwhile must not hold the others for the startup
  // timeout.
  mesh.connect_timeout = std::min(mesh.connect_timeout, o.cluster.heartbeat_timeout + Millis(5000));
  auto tcp = std::make_unique<TcpTransport>(a.rank, a.size(), mesh, bind_host, std::move(listener));
  client->attach(a.round, tcp->verdict_port());
  // LOCAL_RANK from the launcher describes the first round only: count.
  Options counted = o;
  counted.collective.local_rank = -1;
  counted.collective.local_size = -1;
  try {
    return connect_group(BootstrapMode::kElastic, std::move(tcp), a.book, mesh_liveness(o, false),
                         counted, mesh.connect_timeout);
  } catch (const Timeout& e) {
    // A member of the round did not connect, or died during the shared-memory
    // setup: a member failure, so the elastic loop re-forms.
    throw PeerFailure(fmt::format("elastic: round {}: {}", a.round, e.what()));
  }
}

}  // namespace pushpull::collective::elastic
