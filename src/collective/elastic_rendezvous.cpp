// SPDX-License-Identifier: Apache-2.0
#include "collective/elastic_rendezvous.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/clock.h"
#include "pushpull/log.h"
#include "transport/peer_policy.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::collective::elastic {

struct RendezvousServer::Impl {
  explicit Impl(ServerConfig c) : cfg(std::move(c)), net(transport_config(cfg)) {}

  static transport::TransportConfig transport_config(const ServerConfig& c) {
    transport::TransportConfig t;
    t.net = c.net;
    t.role = Role::kScheduler;
    t.rank = 0;
    t.label = "elastic rendezvous";
    return t;
  }

  struct Waiting {
    transport::ConnId conn;
    std::string host;
    int port;
    Clock::time_point since;
  };

  ServerConfig cfg;
  transport::MessageTransport net;
  mutable std::mutex mu;
  std::set<std::string> alive;
  std::map<std::string, transport::ConnId> conn_of;  // the worker's connection, once it asked
  std::map<std::string, Waiting> waiting;            // asked, not placed yet
  std::vector<std::string> order;                    // fresh workers in the order they asked
  RoundInfo round;
  uint64_t stamp = 0;  // host changes announced so far
  std::optional<Status> refused;

  void send(transport::ConnId conn, uint16_t type, const std::vector<std::byte>& payload,
            uint32_t flags = 0) {
    (void)net.send_copy(conn, transport::Header{.type = type, .flags = flags}, payload.data(),
                        payload.size());
  }
  void decline(transport::ConnId conn, const Status& why) {
    std::vector<std::byte> p(why.message().size());
    std::memcpy(p.data(), why.message().data(), p.size());
    send(conn, kDeclineType, p, static_cast<uint32_t>(why.code()));
  }
  bool is_member(const std::string& id) const {
    return std::find(round.members.begin(), round.members.end(), id) != round.members.end();
  }

  // mu held.
  void on_join(transport::ConnId conn, const JoinRequest& j) {
    if (refused) return decline(conn, *refused);
    if (!alive.count(j.worker_id))
      return decline(conn, Status(ErrorCode::kInvalidArgument,
                                  fmt::format("elastic rendezvous: worker '{}' is not a live "
                                              "worker of this job (it was removed: it failed, "
                                              "hung or its host left)",
                                              j.worker_id)));
    conn_of[j.worker_id] = conn;
    const bool fresh = !is_member(j.worker_id);
    if (!waiting.count(j.worker_id) && fresh) order.push_back(j.worker_id);
    waiting[j.worker_id] = Waiting{conn, j.host, j.port, Clock::now()};
    PP_DEBUG("elastic rendezvous: worker {} asks to join ({}:{})", j.worker_id, j.host, j.port);
    // A newcomer while a round runs: the members re-form at their next
    // commit (unless they are re-forming already).
    if (fresh && round.round > 0 && !any_member_waiting()) announce();
  }

  bool any_member_waiting() const {
    for (const auto& m : round.members)
      if (waiting.count(m)) return true;
    return false;
  }

  void announce() {
    ++stamp;
    auto p = encode_stamp(stamp);
    for (const auto& m : round.members)
      if (auto it = conn_of.find(m); it != conn_of.end() && alive.count(m))
        send(it->second, kHostsType, p);
  }

  // mu held. Returns stragglers.
  std::vector<std::string> poll() {
    std::vector<std::string> stragglers;
    if (refused || waiting.empty()) return stragglers;
    const auto now = Clock::now();
    std::vector<std::string> members;  // of the next round, ordered
    if (round.round == 0) {
      bool all = std::all_of(alive.begin(), alive.end(),
                             [&](const std::string& id) { return waiting.count(id) > 0; });
      auto first = std::min_element(waiting.begin(), waiting.end(), [](auto& a, auto& b) {
                     return a.second.since < b.second.since;
                   })->second.since;
      if (!all && now - first < cfg.startup_window) return stragglers;
    } else {
      std::vector<std::string> live_members;
      for (const auto& m : round.members)
        if (alive.count(m)) live_members.push_back(m);
      std::optional<Clock::time_point> first;
      bool all = true;
      for (const auto& m : live_members) {
        auto it = waiting.find(m);
        if (it == waiting.end()) {
          all = false;
        } else if (!first || it->second.since < *first) {
          first = it->second.since;
        }
      }
      if (!first) {
        // No member re-forms: newcomers wait for the members' next commit;
        // with no live member at all they make the next round alone.
        if (!live_members.empty()) return stragglers;
      } else if (!all) {
        if (now - *first < cfg.member_window) return stragglers;
        for (const auto& m : live_members)
          if (!waiting.count(m)) stragglers.push_back(m);
      }
      for (const auto& m : live_members)
        if (waiting.count(m)) members.push_back(m);
    }
    for (const auto& id : order)
      if (waiting.count(id) && alive.count(id)) members.push_back(id);
    if (static_cast<int>(members.size()) < cfg.min_workers) {
      // Not enough to form: keep waiting (the driver decides when to give up).
      return {};
    }
    for (const auto& s : stragglers)
      alive.erase(s);
    form(members);
    return stragglers;
  }

  void form(const std::vector<std::string>& members) {
    Assignment a;
    a.round = round.round + 1;
    a.hosts_stamp = stamp;
    for (const auto& id : members) {
      const Waiting& w = waiting.at(id);
      a.book.emplace_back(w.host, w.port);
    }
    for (size_t r = 0; r < members.size(); ++r) {
      a.rank = static_cast<int>(r);
      send(waiting.at(members[r]).conn, kAssignType, encode(a));
      waiting.erase(members[r]);
    }
    std::vector<std::string> rest;
    for (const auto& id : order)
      if (waiting.count(id)) rest.push_back(id);
    order = std::move(rest);
    round.round = a.round;
    round.members = members;
    PP_INFO("elastic rendezvous: round {} formed with {} workers ({})", a.round, members.size(),
            fmt::join(members, ", "));
  }
};

RendezvousServer::RendezvousServer(ServerConfig config)
    : impl_(std::make_shared<Impl>(std::move(config))) {
  Impl& s = *impl_;
  s.net.listen(s.cfg.bind_host, s.cfg.port);
  std::weak_ptr<Impl> weak = impl_;
  s.net.set_handler(kJoinType, kJoinType, [weak](transport::Message&& m) {
    auto self = weak.lock();
    if (!self) return;
    JoinRequest j;
    if (Status d = decode(m.payload.data(), m.payload.size(), &j); !d.is_ok()) {
      PP_WARN("elastic rendezvous: {}", d.message());
      self->net.close(m.conn, d);
      return;
    }
    std::lock_guard lock(self->mu);
    self->on_join(m.conn, j);
  });
  s.net.start();
}

RendezvousServer::~RendezvousServer() {
  impl_->net.drain(Millis(1000));
  impl_->net.stop();
}

int RendezvousServer::port() const {
  return impl_->net.port();
}

void RendezvousServer::add_worker(const std::string& id) {
  std::lock_guard lock(impl_->mu);
  impl_->alive.insert(id);
}

void RendezvousServer::remove_worker(const std::string& id, const std::string& why, bool announce) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  s.alive.erase(id);
  s.waiting.erase(id);
  s.conn_of.erase(id);
  if (!announce || !s.is_member(id)) return;
  auto p = encode(MemberGone{s.round.round, why});
  for (const auto& m : s.round.members)
    if (m != id && s.alive.count(m))
      if (auto it = s.conn_of.find(m); it != s.conn_of.end())
        s.send(it->second, kMemberGoneType, p);
}

std::vector<std::string> RendezvousServer::poll() {
  std::lock_guard lock(impl_->mu);
  return impl_->poll();
}

void RendezvousServer::refuse_all(const Status& why) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  if (s.refused) return;
  s.refused = why;
  for (const auto& [id, w] : s.waiting)
    s.decline(w.conn, why);
  s.waiting.clear();
}

RoundInfo RendezvousServer::current() const {
  std::lock_guard lock(impl_->mu);
  return impl_->round;
}

}  // namespace pushpull::collective::elastic
