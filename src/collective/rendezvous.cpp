// SPDX-License-Identifier: Apache-2.0
#include "collective/rendezvous.h"

#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collective/bootstrap.h"
#include "net/host_table.h"
#include "net/node_id.h"
#include "net/peer_policy.h"
#include "net/socket.h"
#include "net/transport.h"
#include "net/wire.h"
#include "pushpull/log.h"

namespace pushpull::collective {
namespace {

constexpr uint32_t kMaxRanks = 1 << 20;
constexpr size_t kMaxHostBytes = 1024;  // a host name or address in a book

Status malformed(const char* what) {
  return {ErrorCode::kProtocolError, fmt::format("collective rendezvous: malformed {}", what)};
}

net::TransportConfig config_of(const RendezvousConfig& c) {
  net::TransportConfig t;
  t.net = c.net;
  t.role = Role::kWorker;
  t.rank = c.rank;
  t.label = fmt::format("rendezvous rank {}", c.rank);
  return t;
}

std::string where(const RendezvousConfig& c) {
  return fmt::format("{}:{}", c.master_addr, c.master_port);
}

// Shared between the caller and the net I/O thread's handlers.
struct State {
  std::mutex mu;
  std::condition_variable cv;
  Status failure;
  // Host side.
  AddressList book;
  std::vector<bool> arrived;
  int count = 0;
  std::map<net::ConnId, int> rank_of;
  std::vector<net::ConnId> hellos;
  bool finished = false;
  // Client side.
  std::optional<AddressList> answer;
};

void fail(State& s, Status why) {
  if (s.failure.is_ok()) s.failure = std::move(why);
  s.cv.notify_all();
}

AddressList host(const RendezvousConfig& c, Clock::time_point deadline) {
  auto st = std::make_shared<State>();
  st->book.assign(static_cast<size_t>(c.size), {});
  st->arrived.assign(static_cast<size_t>(c.size), false);
  st->book[0] = {c.host, c.port};
  st->arrived[0] = true;
  net::Transport t(config_of(c));
  // `pushpull launch` binds rank 0's rendezvous port itself and hands the
  // listening socket down (PUSHPULL_LISTEN_FD), so nobody can take the port
  // between its choice and this listen; else (torchrun, by hand) bind it.
  net::Fd held;
  if (Status taken = net::take_inherited_listener(c.master_port, c.net.inherited_listener, &held);
      taken) {
    PP_DEBUG("collective rendezvous: listening on the socket the launcher bound (port {})",
             c.master_port);
    t.listen(std::move(held));
  } else {
    if (!c.net.inherited_listener.empty())
      PP_DEBUG("collective rendezvous: not using {}: {}", net::kListenFdVariable, taken.message());
    t.listen(net::bind_host_for(c.master_addr, c.net.bind_any), c.master_port);
  }
  // A hello that is malformed, or whose rank is out of range, taken, or not
  // the one its connection authenticated as, closes that connection only
  // (told why); it never fails the rendezvous of the real members.
  auto refuse = [&t](net::ConnId conn, const std::string& why) {
    PP_ERROR("collective rendezvous: refusing a connection: {}", why);
    (void)t.send_copy(conn,
                      net::Header{.type = kRefuseType,
                                  .flags = static_cast<uint32_t>(ErrorCode::kInvalidArgument)},
                      why.data(), why.size());
    t.close(conn, Status(ErrorCode::kProtocolError, why));
  };
  t.set_handler(kHelloType, kHelloType, [st, &c, refuse](net::Message&& m) {
    int rank = -1, size = 0, port = 0;
    std::string h;
    Status d = decode_hello(m.payload.data(), m.payload.size(), &rank, &size, &h, &port);
    const auto [role, authenticated] = net::node_of_id(m.header.sender);
    std::unique_lock lock(st->mu);
    if (!d.is_ok()) {
      lock.unlock();
      return refuse(m.conn, d.message());
    }
    if (rank <= 0 || rank >= c.size || rank != authenticated || role != Role::kWorker ||
        st->arrived[static_cast<size_t>(rank)] || st->rank_of.count(m.conn)) {
      lock.unlock();
      return refuse(m.conn,
                    fmt::format("collective rendezvous: a process claims rank {} ({}); ranks "
                                "must be 1..{} once each besides rank 0; check RANK of every "
                                "process",
                                rank,
                                rank <= 0 || rank >= c.size ? "out of range"
                                : rank != authenticated     ? "not the rank it connected as"
                                                            : "twice",
                                c.size - 1));
    }
    st->hellos.push_back(m.conn);  // told of the outcome
    if (size != c.size)
      return fail(*st, Status(ErrorCode::kInvalidArgument,
                              fmt::format("collective rendezvous: rank {} says the world has {} "
                                          "ranks, rank 0 says {}; give every process the same "
                                          "WORLD_SIZE",
                                          rank, size, c.size)));
    st->book[static_cast<size_t>(rank)] = {h, port};
    st->arrived[static_cast<size_t>(rank)] = true;
    st->rank_of[m.conn] = rank;
    ++st->count;
    st->cv.notify_all();
  });
  t.set_close_handler([st](net::ConnId id, const net::PeerInfo& p, const Status& why) {
    std::lock_guard lock(st->mu);
    if (st->finished) return;
    auto it = st->rank_of.find(id);
    int rank = it != st->rank_of.end() ? it->second : p.rank;
    if (it == st->rank_of.end()) return;  // never said hello: nothing to lose
    fail(*st, Status(ErrorCode::kPeerFailure,
                     fmt::format("collective rendezvous: rank {} ({}) closed its connection to "
                                 "rank 0 before every rank arrived ({}); did it die?",
                                 rank, p.address, why.message())));
  });
  t.start();

  std::unique_lock lock(st->mu);
  bool ok = st->cv.wait_until(lock, deadline,
                              [&] { return st->count == c.size - 1 || !st->failure.is_ok(); });
  Status result = st->failure;
  if (result.is_ok() && !ok) {
    std::vector<int> missing;
    for (int r = 1; r < c.size; ++r)
      if (!st->arrived[static_cast<size_t>(r)]) missing.push_back(r);
    result = Status(ErrorCode::kTimeout,
                    fmt::format("collective rendezvous: rank 0 waited {} ms at {} for ranks {}; "
                                "check that they started with the same MASTER_ADDR/MASTER_PORT "
                                "and can reach it",
                                c.timeout.count(), where(c), fmt::join(missing, ", ")));
  }
  st->finished = true;
  std::vector<net::ConnId> conns = st->hellos;
  AddressList book = st->book;
  lock.unlock();

  if (result.is_ok()) {
    auto payload = encode_book(book);
    for (auto id : conns)
      if (Status s =
              t.send_copy(id, net::Header{.type = kBookType}, payload.data(), payload.size());
          !s.is_ok())
        result =
            Status(ErrorCode::kPeerFailure,
                   fmt::format("collective rendezvous: sending the address list: {}", s.message()));
  }
  if (!result.is_ok()) {
    // Tell the others at once instead of leaving them to their deadline.
    const std::string& why = result.message();
    for (auto id : conns)
      (void)t.send_copy(
          id, net::Header{.type = kRefuseType, .flags = static_cast<uint32_t>(result.code())},
          why.data(), why.size());
  }
  t.drain(Millis(2000));
  t.stop();
  result.raise();
  return book;
}

AddressList join(const RendezvousConfig& c, Clock::time_point deadline) {
  auto st = std::make_shared<State>();
  net::Transport t(config_of(c));
  t.set_handler(kBookType, kRefuseType, [st](net::Message&& m) {
    std::lock_guard lock(st->mu);
    if (m.header.type == kRefuseType) {
      std::string why(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
      // flags: the host's error code (a conflict stays an InvalidArgument,
      // a missing rank a Timeout); anything else is the host failing.
      uint32_t f = m.header.flags;
      ErrorCode code = f == static_cast<uint32_t>(ErrorCode::kInvalidArgument) ||
                               f == static_cast<uint32_t>(ErrorCode::kTimeout)
                           ? static_cast<ErrorCode>(f)
                           : ErrorCode::kPeerFailure;
      return fail(*st, Status(code, fmt::format("rank 0 ended the rendezvous: {}", why)));
    }
    AddressList book;
    Status d = decode_book(m.payload.data(), m.payload.size(), &book);
    if (!d.is_ok()) return fail(*st, d);
    st->answer = std::move(book);
    st->cv.notify_all();
  });
  t.set_close_handler([st, &c](net::ConnId, const net::PeerInfo&, const Status& why) {
    std::lock_guard lock(st->mu);
    if (st->answer) return;
    fail(*st, Status(ErrorCode::kPeerFailure,
                     fmt::format("collective rendezvous: rank 0 at {} closed the connection "
                                 "before the rendezvous completed ({}); did rank 0 fail?",
                                 where(c), why.message())));
  });
  t.start();
  auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  net::ConnId conn = t.connect(c.master_addr, c.master_port, std::max(left, Millis(1)));
  auto hello = encode_hello(c.rank, c.size, c.host, c.port);
  if (Status s = t.send_copy(conn, net::Header{.type = kHelloType}, hello.data(), hello.size());
      !s.is_ok())
    throw PeerFailure(fmt::format("collective rendezvous: rank {} could not reach rank 0 at {}: {}",
                                  c.rank, where(c), s.message()));
  // Rank 0 has the same deadline and the better verdict (which ranks are
  // missing): give its answer a moment to arrive.
  std::unique_lock lock(st->mu);
  bool ok = st->cv.wait_until(lock, deadline + Millis(2000),
                              [&] { return st->answer || !st->failure.is_ok(); });
  Status result = st->failure;
  if (result.is_ok() && !ok)
    result = Status(ErrorCode::kTimeout,
                    fmt::format("collective rendezvous: rank {} waited {} ms for rank 0 at {} to "
                                "send the address list (other ranks missing?)",
                                c.rank, c.timeout.count(), where(c)));
  AddressList book = st->answer.value_or(AddressList{});
  lock.unlock();
  t.stop();
  result.raise();
  if (static_cast<int>(book.size()) != c.size)
    throw ProtocolError(fmt::format("collective rendezvous: rank 0 sent {} addresses for {} ranks",
                                    book.size(), c.size));
  return book;
}

}  // namespace

std::vector<std::byte> encode_hello(int rank, int size, const std::string& host, int port) {
  net::Writer w;
  w.u<int32_t>(rank).u<int32_t>(size).str(host).u<int32_t>(port);
  return w.take();
}

Status decode_hello(const std::byte* data, size_t n, int* rank, int* size, std::string* host,
                    int* port) {
  net::Reader r({data, n});
  *rank = r.u<int32_t>();
  *size = r.u<int32_t>();
  *host = r.str();
  *port = r.u<int32_t>();
  return r.ok() && r.at_end() ? Status{} : malformed("hello");
}

void put_address_list(net::Writer& w, const AddressList& book) {
  std::vector<std::string_view> hosts;
  hosts.reserve(book.size());
  for (const auto& [h, p] : book)
    hosts.push_back(h);
  const std::vector<uint32_t> at = net::put_host_table(w, hosts);
  w.u<uint32_t>(static_cast<uint32_t>(book.size()));
  for (size_t i = 0; i < book.size(); ++i)
    w.u<uint32_t>(at[i]).u<uint16_t>(static_cast<uint16_t>(book[i].second));
}

bool get_address_list(net::Reader& r, size_t max_ranks, AddressList* book) {
  net::HostTableReader hosts;
  if (!hosts.read(r, max_ranks, kMaxHostBytes)) return false;
  const size_t count = r.count(max_ranks, 6);
  if (!r.ok()) return false;
  book->clear();
  book->reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const std::string* host = hosts.take(r.u<uint32_t>());
    const int port = r.u<uint16_t>();
    if (!r.ok() || host == nullptr || port == 0) return false;
    book->emplace_back(*host, port);
  }
  return hosts.complete();
}

std::vector<std::byte> encode_book(const AddressList& book) {
  net::Writer w;
  put_address_list(w, book);
  return w.take();
}

Status decode_book(const std::byte* data, size_t n, AddressList* book) {
  net::Reader r({data, n});
  return get_address_list(r, kMaxRanks, book) && r.at_end() ? Status{} : malformed("address list");
}

AddressList rendezvous(const RendezvousConfig& c) {
  if (c.size < 1 || c.rank < 0 || c.rank >= c.size)
    throw InvalidArgument(fmt::format("collective rendezvous: rank {} of size {}", c.rank, c.size));
  if (c.size == 1) return {{c.host, c.port}};
  if (c.master_addr.empty() || c.master_port <= 0 || c.master_port > 65535)
    throw InvalidArgument(fmt::format(
        "collective rendezvous: no rendezvous address (MASTER_ADDR '{}', MASTER_PORT {}); set "
        "MASTER_ADDR and MASTER_PORT (or PUSHPULL_MASTER_ADDR / PUSHPULL_MASTER_PORT) to rank "
        "0's host and a free port, the same for every process",
        c.master_addr, c.master_port));
  auto deadline = Clock::now() + c.timeout;
  PP_DEBUG("collective rendezvous: rank {} of {} at {}", c.rank, c.size, where(c));
  return c.rank == 0 ? host(c, deadline) : join(c, deadline);
}

}  // namespace pushpull::collective
