// SPDX-License-Identifier: Apache-2.0
#include "cluster/protocol.h"

#include <algorithm>
#include <tuple>

#include <fmt/format.h>

#include "transport/host_table.h"
#include "transport/node_id.h"
#include "transport/socket.h"
#include "transport/wire.h"

namespace pushpull::cluster {

std::string_view group_name(Group g) {
  switch (g) {
    case Group::kWorkers:
      return "workers";
    case Group::kServers:
      return "servers";
    case Group::kAll:
      return "all";
  }
  return "?";
}

std::string NodeAddress::describe() const {
  std::string who = rank < 0 || role == Role::kNone ? std::string(role_name(role))
                                                    : fmt::format("{} {}", role_name(role), rank);
  return fmt::format("{} (host {})", who, transport::format_address(host, port));
}

const NodeAddress& AddressBook::at(Role role, int rank) const {
  if (role == Role::kScheduler) return scheduler;
  const auto& list = role == Role::kServer ? servers : workers;
  if (role == Role::kNone || rank < 0 || rank >= static_cast<int>(list.size()))
    throw NotFound(fmt::format("no {} {} in this job ({} servers, {} workers)", role_name(role),
                               rank, servers.size(), workers.size()));
  return list[static_cast<size_t>(rank)];
}

uint32_t node_id(Role role, int rank) {
  return transport::node_id(role, rank);
}

NodeAddress from_node_id(uint32_t id) {
  NodeAddress a;
  std::tie(a.role, a.rank) = transport::node_of_id(id);
  return a;
}

namespace {
constexpr size_t kMaxNodes = 1000000;
constexpr size_t kMaxHost = 1024;
constexpr size_t kMaxReason = 64 * 1024;
// A server or worker in the book: host index, port, mesh port.
constexpr size_t kBookEntryBytes = 4 + 2 + 2;

void put(transport::Writer& w, const NodeAddress& a) {
  w.u<uint8_t>(static_cast<uint8_t>(a.role)).u<int32_t>(a.rank).str(a.host).u<int32_t>(a.port);
  w.u<int32_t>(a.mesh_port);
}
bool get(transport::Reader& r, NodeAddress* a) {
  auto role = r.u<uint8_t>();
  a->rank = r.u<int32_t>();
  a->host = r.str(kMaxHost);
  a->port = r.u<int32_t>();
  a->mesh_port = r.u<int32_t>();
  // Ports fit the book's 16 bits (encode_book).
  if (role > static_cast<uint8_t>(Role::kWorker) || a->port < 0 || a->port > 65535 ||
      a->mesh_port < 0 || a->mesh_port > 65535)
    return false;
  a->role = static_cast<Role>(role);
  return r.ok();
}
Status bad(const char* what) {
  return {ErrorCode::kProtocolError, fmt::format("malformed {} message", what)};
}
}  // namespace

std::vector<std::byte> encode_register(const NodeAddress& me, int32_t preferred_rank) {
  transport::Writer w;
  put(w, me);
  w.u<int32_t>(preferred_rank);
  return w.take();
}

Status decode_register(std::span<const std::byte> in, NodeAddress* me, int32_t* preferred_rank) {
  transport::Reader r(in);
  if (!get(r, me)) return bad("register");
  *preferred_rank = r.u<int32_t>();
  return r.done() ? Status{} : bad("register");
}

bool same_host(const AddressBook& book) {
  const std::string* first = nullptr;
  for (const auto* list : {&book.servers, &book.workers})
    for (const NodeAddress& a : *list) {
      if (a.host.empty()) return false;
      if (!first) first = &a.host;
      if (a.host != *first) return false;
    }
  return first != nullptr;
}

// The book's wire form: the scheduler in full, then the servers' and
// workers' hosts as a table (transport/host_table.h) and each of them as (host
// index, port, mesh port); rank = position, role = list. 8 bytes a node
// instead of 30 or more.
std::vector<std::byte> encode_book(int32_t your_rank, const AddressBook& book) {
  std::vector<std::string_view> hosts;
  hosts.reserve(book.servers.size() + book.workers.size());
  for (const auto* list : {&book.servers, &book.workers})
    for (const NodeAddress& a : *list)
      hosts.push_back(a.host);
  transport::Writer w;
  w.reserve(64 + hosts.size() * kBookEntryBytes);
  w.u<int32_t>(your_rank);
  put(w, book.scheduler);
  const std::vector<uint32_t> at = transport::put_host_table(w, hosts);
  size_t i = 0;
  for (const auto* list : {&book.servers, &book.workers}) {
    w.u<uint32_t>(static_cast<uint32_t>(list->size()));
    for (const NodeAddress& a : *list)
      w.u<uint32_t>(at[i++])
          .u<uint16_t>(static_cast<uint16_t>(a.port))
          .u<uint16_t>(static_cast<uint16_t>(a.mesh_port));
  }
  w.u<uint8_t>(static_cast<uint8_t>((book.worker_restarts ? 1 : 0) | (book.one_host ? 2 : 0)));
  w.u<int32_t>(book.incarnation);
  return w.take();
}

void set_book_rank(std::vector<std::byte>& encoded, int32_t your_rank) {
  if (encoded.size() >= 4) transport::store_le<int32_t>(encoded.data(), your_rank);
}

Status decode_book(std::span<const std::byte> in, int32_t* your_rank, AddressBook* book) {
  transport::Reader r(in);
  *your_rank = r.u<int32_t>();
  if (!get(r, &book->scheduler)) return bad("address book");
  transport::HostTableReader hosts;
  if (!hosts.read(r, kMaxNodes, kMaxHost)) return bad("address book");
  for (Role role : {Role::kServer, Role::kWorker}) {
    auto& list = role == Role::kServer ? book->servers : book->workers;
    const size_t n = r.count(kMaxNodes, kBookEntryBytes);
    if (!r.ok()) return bad("address book");
    list.resize(n);
    for (size_t k = 0; k < n; ++k) {
      const std::string* host = hosts.take(r.u<uint32_t>());
      if (!r.ok() || host == nullptr) return bad("address book");
      list[k] = NodeAddress{role, static_cast<int32_t>(k), *host, r.u<uint16_t>(), r.u<uint16_t>()};
    }
  }
  const auto flags = r.u<uint8_t>();
  book->incarnation = r.u<int32_t>();
  if (!r.ok() || !hosts.complete() || flags > 3 || book->incarnation < 0)
    return bad("address book");
  book->worker_restarts = (flags & 1) != 0;
  book->one_host = (flags & 2) != 0;
  return r.done() ? Status{} : bad("address book");
}

std::vector<std::byte> encode_dead(const NodeAddress& who, const std::string& reason) {
  transport::Writer w;
  put(w, who);
  w.str(std::string_view(reason).substr(0, kMaxReason));
  return w.take();
}

Status decode_dead(std::span<const std::byte> in, NodeAddress* who, std::string* reason) {
  transport::Reader r(in);
  if (!get(r, who)) return bad("peer dead");
  *reason = r.str(kMaxReason);
  return r.done() ? Status{} : bad("peer dead");
}

int ps_replicas(int configured, int num_servers) {
  if (num_servers < 2) return 0;
  int r = configured < 0 ? 1 : configured;
  return std::min(r, num_servers - 1);
}

ReplicaChain replica_chain(int home, int num_servers, int replicas, const std::vector<bool>& dead,
                           const std::vector<uint32_t>& late) {
  ReplicaChain c;
  std::vector<int> live, rejoined;
  auto order = [&](int s) { return static_cast<size_t>(s) < late.size() ? late[s] : 0u; };
  for (int i = 0; i <= replicas && num_servers > 0; ++i) {
    int s = (home + i) % num_servers;
    if (static_cast<size_t>(s) < dead.size() && dead[static_cast<size_t>(s)]) continue;
    (order(s) > 0 ? rejoined : live).push_back(s);
  }
  std::stable_sort(rejoined.begin(), rejoined.end(),
                   [&](int a, int b) { return order(a) < order(b); });
  live.insert(live.end(), rejoined.begin(), rejoined.end());
  for (int s : live)
    if (c.primary < 0)
      c.primary = s;
    else
      c.backups.push_back(s);
  return c;
}

int first_lost_home(int num_servers, int replicas, const std::vector<bool>& dead) {
  for (int h = 0; h < num_servers; ++h)
    if (replica_chain(h, num_servers, replicas, dead).primary < 0) return h;
  return -1;
}

std::vector<std::byte> encode_placement(const Placement& p) {
  transport::Writer w;
  w.u<uint64_t>(p.epoch).u<uint32_t>(static_cast<uint32_t>(p.dead.size()));
  // Per server: flags (1 dead, 2 rejoined, 4 restarting), then a rejoined
  // server's rejoin order (u32).
  for (size_t i = 0; i < p.dead.size(); ++i) {
    const uint32_t late = i < p.late.size() ? p.late[i] : 0;
    w.u<uint8_t>((p.dead[i] ? 1 : 0) | (late > 0 ? 2 : 0) |
                 (i < p.restarting.size() && p.restarting[i] ? 4 : 0));
    if (late > 0) w.u<uint32_t>(late);
  }
  return w.take();
}

Status decode_placement(std::span<const std::byte> in, Placement* p) {
  transport::Reader r(in);
  Placement out;
  out.epoch = r.u<uint64_t>();
  uint32_t n = r.u<uint32_t>();
  if (!r.ok() || n > kMaxNodes) return bad("placement");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    const auto b = r.u<uint8_t>();
    if (b > 7) return bad("placement");
    out.dead.push_back((b & 1) != 0);
    out.late.push_back((b & 2) != 0 ? r.u<uint32_t>() : 0);
    if ((b & 2) != 0 && out.late.back() == 0) return bad("placement");
    out.restarting.push_back((b & 4) != 0);
  }
  if (!r.done()) return bad("placement");
  *p = std::move(out);
  return Status{};
}

}  // namespace pushpull::cluster
