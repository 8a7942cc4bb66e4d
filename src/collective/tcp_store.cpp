// SPDX-License-Identifier: Apache-2.0
#include "collective/tcp_store.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "pushpull/log.h"
#include "transport/node_id.h"
#include "transport/peer_policy.h"
#include "transport/socket.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::collective {

namespace {

constexpr size_t kMaxKeyBytes = 256;

using Bytes = std::vector<std::byte>;
struct Waiter {
  transport::ConnId conn;
  uint64_t id;
};

void reply(transport::MessageTransport& t, transport::ConnId conn, uint64_t id, const Status& s,
           const Bytes& value) {
  const std::string& why = s.message();
  const void* data = s.is_ok() ? static_cast<const void*>(value.data()) : why.data();
  (void)t.send_copy(
      conn,
      transport::Header{
          .type = kStoreReply, .flags = static_cast<uint32_t>(s.code()), .request_id = id},
      data, s.is_ok() ? value.size() : why.size());
}

}  // namespace

// Shared between the owner's thread and the Transport's I/O thread.
struct TcpStore::State {
  std::mutex mu;
  std::condition_variable cv;
  int rank = 0;
  int size = 1;
  std::string where;
  Status failure;  // host: a member died; client: rank 0 is gone
  // Host.
  std::map<std::string, Bytes> kv;
  std::multimap<std::string, Waiter> waiting;  // members' gets not answered yet
  std::set<transport::ConnId> members;         // open connections that made a request
  // Client.
  transport::ConnId conn = 0;
  uint64_t next_id = 0;
  std::map<uint64_t, std::pair<Status, Bytes>> replies;
  bool closing = false;

  // Stores key (write-once); returns the members' gets it answers.
  // Call with mu held.
  Status put(const std::string& key, Bytes value, std::vector<Waiter>* answer) {
    auto [it, fresh] = kv.try_emplace(key, std::move(value));
    if (!fresh && it->second != value)
      return {ErrorCode::kInvalidArgument,
              fmt::format("collective rendezvous: '{}' is set already, to other bytes: two "
                          "processes claim one rank; check RANK of every process",
                          key)};
    auto [from, to] = waiting.equal_range(key);
    for (auto w = from; w != to; ++w)
      answer->push_back(w->second);
    waiting.erase(from, to);
    cv.notify_all();
    return {};
  }
};

namespace {

// Rank 0's side: a request from a member, on the I/O thread.
void serve(TcpStore::State& st, transport::MessageTransport& t, transport::Message&& m) {
  std::string key;
  Bytes value;
  const bool is_set = m.header.type == kStoreSet;
  Status s = decode_store_request({m.payload.data(), m.payload.size()}, is_set, &key, &value);
  const auto [role, rank] = transport::node_of_id(m.header.sender);
  if (s.is_ok() && (role != Role::kWorker || rank <= 0 || rank >= st.size))
    s = Status(ErrorCode::kInvalidArgument,
               fmt::format("collective rendezvous: a process claims rank {} (out of range); "
                           "ranks must be 1..{} once each besides rank 0; check RANK of every "
                           "process",
                           rank, st.size - 1));
  const std::string mine = fmt::format("/{}", rank);
  if (s.is_ok() && is_set && !key.ends_with(mine))
    s = Status(ErrorCode::kInvalidArgument,
               fmt::format("collective rendezvous: rank {} sets '{}', a key of another rank (not "
                           "the rank it connected as)",
                           rank, key));
  if (s.is_ok()) {
    std::lock_guard lock(st.mu);
    // Keys and held gets cost rank 0's memory: a few per rank are enough.
    if (st.kv.size() + st.waiting.size() > 4 * static_cast<size_t>(st.size) + 64)
      s = Status(ErrorCode::kInvalidArgument,
                 fmt::format("collective rendezvous: rank {} exceeds the store's keys", rank));
  }
  if (!s.is_ok()) {  // this connection only
    PP_ERROR("collective rendezvous: refusing a connection: {}", s.message());
    reply(t, m.conn, m.header.request_id, s, {});
    return t.close(m.conn, Status(ErrorCode::kProtocolError, s.message()));
  }
  std::vector<Waiter> answer;
  Bytes found;
  {
    std::lock_guard lock(st.mu);
    st.members.insert(m.conn);
    if (is_set) {
      s = st.put(key, value, &answer);
    } else if (auto it = st.kv.find(key); it != st.kv.end()) {
      found = it->second;
    } else {
      st.waiting.emplace(key, Waiter{m.conn, m.header.request_id});
      return;
    }
  }
  reply(t, m.conn, m.header.request_id, s, found);
  for (const Waiter& w : answer)
    reply(t, w.conn, w.id, {}, value);
}

}  // namespace

TcpStore::TcpStore(const Options& o, Clock::time_point deadline)
    : st_(std::make_shared<State>()), linger_until_(deadline + Millis(2000)) {
  const CollectiveOptions& c = o.collective;
  st_->rank = c.rank;
  st_->size = c.size;
  st_->where = fmt::format("{}:{}", c.master_addr, c.master_port);
  if (c.master_addr.empty() || c.master_port <= 0 || c.master_port > 65535)
    throw InvalidArgument(fmt::format(
        "collective rendezvous: no rendezvous address (MASTER_ADDR '{}', MASTER_PORT {}); set "
        "MASTER_ADDR and MASTER_PORT (or PUSHPULL_MASTER_ADDR / PUSHPULL_MASTER_PORT) to rank "
        "0's host and a free port, the same for every process",
        c.master_addr, c.master_port));
  transport::TransportConfig tc;
  tc.net = o.net;
  tc.role = Role::kWorker;
  tc.rank = c.rank;
  tc.label = fmt::format("rendezvous rank {}", c.rank);
  t_ = std::make_unique<transport::MessageTransport>(tc);
  State* st = st_.get();
  if (c.rank == 0) {
    // `pushpull launch` (and the torch backend) bind rank 0's port
    // themselves and hand the listening socket down, so nobody can take the
    // port between its choice and this listen; else (torchrun, by hand)
    // bind it.
    transport::Fd held;
    if (Status taken =
            transport::take_inherited_listener(c.master_port, o.net.inherited_listener, &held);
        taken) {
      t_->listen(std::move(held));
    } else {
      if (!o.net.inherited_listener.empty())
        PP_DEBUG("collective rendezvous: not using {}: {}", transport::kListenFdVariable,
                 taken.message());
      t_->listen(transport::bind_host_for(c.master_addr, o.net.bind_any), c.master_port);
    }
    t_->set_handler(kStoreSet, kStoreGet,
                    [st, t = t_.get()](transport::Message&& m) { serve(*st, *t, std::move(m)); });
    t_->set_close_handler(
        [st](transport::ConnId id, const transport::PeerInfo& p, const Status& why) {
          std::lock_guard lock(st->mu);
          st->members.erase(id);
          bool waited = false;
          for (auto it = st->waiting.begin(); it != st->waiting.end();)
            if (it->second.conn == id) {
              waited = true;
              it = st->waiting.erase(it);
            } else {
              ++it;
            }
          if (waited && st->failure.is_ok())
            st->failure = Status(ErrorCode::kPeerFailure,
                                 fmt::format("collective rendezvous: rank {} ({}) closed its "
                                             "connection to rank 0 before every rank arrived ({}); "
                                             "did it die?",
                                             p.rank, p.address, why.message()));
          st->cv.notify_all();
        });
    t_->start();
    return;
  }
  t_->set_handler(kStoreReply, kStoreReply, [st](transport::Message&& m) {
    std::lock_guard lock(st->mu);
    Status s;
    // Any other code is the host misbehaving.
    const auto code = m.header.flags <= static_cast<uint32_t>(ErrorCode::kInternal)
                          ? static_cast<ErrorCode>(m.header.flags)
                          : ErrorCode::kProtocolError;
    if (code != ErrorCode::kOk)
      s = Status(code,
                 std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size()));
    st->replies[m.header.request_id] = {
        s, Bytes(m.payload.data(), m.payload.data() + m.payload.size())};
    st->cv.notify_all();
  });
  t_->set_close_handler([st](transport::ConnId, const transport::PeerInfo&, const Status& why) {
    std::lock_guard lock(st->mu);
    if (!st->closing && st->failure.is_ok())
      st->failure = Status(ErrorCode::kPeerFailure,
                           fmt::format("collective rendezvous: rank 0 at {} closed the connection "
                                       "before the rendezvous completed ({}); did rank 0 fail?",
                                       st->where, why.message()));
    st->cv.notify_all();
  });
  t_->start();
  auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  st_->conn = t_->connect(c.master_addr, c.master_port, std::max(left, Millis(1)));
}

TcpStore::~TcpStore() {
  {
    std::unique_lock lock(st_->mu);
    st_->closing = true;
    // Rank 0: until every member has read its answers (they leave then).
    if (st_->rank == 0)
      st_->cv.wait_until(lock, linger_until_, [&] { return st_->members.empty(); });
  }
  t_->stop();
}

std::string TcpStore::where() const {
  return st_->where;
}

namespace {

// A client's request and its reply (a get's: once the key is set).
std::pair<Status, Bytes> ask(TcpStore::State& st, transport::MessageTransport& t, uint16_t type,
                             const std::string& key, std::span<const std::byte> value,
                             Clock::time_point deadline) {
  uint64_t id = 0;
  {
    std::lock_guard lock(st.mu);
    id = ++st.next_id;
  }
  Bytes payload = encode_store_request(key, value);
  if (Status s = t.send_copy(st.conn, transport::Header{.type = type, .request_id = id},
                             payload.data(), payload.size());
      !s.is_ok())
    throw PeerFailure(fmt::format("collective rendezvous: rank {} could not reach rank 0 at {}: {}",
                                  st.rank, st.where, s.message()));
  std::unique_lock lock(st.mu);
  st.cv.wait_until(lock, deadline, [&] { return st.replies.count(id) || !st.failure.is_ok(); });
  if (auto it = st.replies.find(id); it != st.replies.end()) {
    auto answer = std::move(it->second);
    st.replies.erase(it);
    return answer;
  }
  st.failure.raise();
  throw Timeout(
      fmt::format("collective rendezvous: rank {} waited for '{}' at {} until its "
                  "deadline (other ranks missing?)",
                  st.rank, key, st.where));
}

}  // namespace

void TcpStore::set(const std::string& key, Bytes value) {
  if (st_->rank != 0) {
    ask(*st_, *t_, kStoreSet, key, value, linger_until_).first.raise();
    return;
  }
  std::vector<Waiter> answer;
  {
    std::lock_guard lock(st_->mu);
    st_->put(key, value, &answer).raise();
  }
  for (const Waiter& w : answer)
    reply(*t_, w.conn, w.id, {}, value);
}

Bytes TcpStore::get(const std::string& key, Clock::time_point deadline) {
  if (st_->rank != 0) {
    auto [s, value] = ask(*st_, *t_, kStoreGet, key, {}, deadline);
    s.raise();
    return value;
  }
  if (!wait({key}, deadline).empty())
    throw Timeout(fmt::format("collective rendezvous: '{}' was not set at {} by the deadline", key,
                              st_->where));
  std::lock_guard lock(st_->mu);
  return st_->kv[key];
}

std::vector<std::string> TcpStore::wait(const std::vector<std::string>& keys,
                                        Clock::time_point deadline) {
  std::vector<std::string> missing;
  if (st_->rank != 0) {  // one get after another: the first missing and those after it
    for (size_t i = 0; i < keys.size(); ++i)
      try {
        get(keys[i], deadline);
      } catch (const Timeout&) {
        missing.assign(keys.begin() + static_cast<std::ptrdiff_t>(i), keys.end());
        break;
      }
    return missing;
  }
  auto all_set = [&] {  // and the ones not, in `missing`
    missing.clear();
    for (const auto& k : keys)
      if (!st_->kv.count(k)) missing.push_back(k);
    return missing.empty();
  };
  std::unique_lock lock(st_->mu);
  st_->cv.wait_until(lock, deadline, [&] { return all_set() || !st_->failure.is_ok(); });
  st_->failure.raise();
  return missing;
}

Bytes encode_store_request(const std::string& key, std::span<const std::byte> value) {
  transport::Writer w;
  w.str(key).bytes(value);
  return w.take();
}

Status decode_store_request(std::span<const std::byte> in, bool with_value, std::string* key,
                            Bytes* value) {
  transport::Reader r(in);
  *key = r.str(kMaxKeyBytes);
  if (with_value) {
    auto rest = r.rest();
    value->assign(rest.begin(), rest.end());
  }
  if (r.ok() && r.at_end() && !key->empty()) return {};
  return {ErrorCode::kProtocolError, "collective rendezvous: malformed store request"};
}

}  // namespace pushpull::collective
