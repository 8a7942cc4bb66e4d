// SPDX-License-Identifier: Apache-2.0
// The backup side of the Server's replication: checking and installing a
// primary's replica, sent by value or lent from a same-host primary's
// memory (docs/ps.md, "Replication on one host"). The primary side and the
// placement changes are in server_replication.cpp.
#include <functional>
#include <memory>

#include <fmt/format.h>

#include "ps/protocol.h"
#include "ps/server.h"
#include "pushpull/log.h"

namespace pushpull::ps {

void Server::on_replica_value(const cluster::NodeAddress& from, net::Message&& m) {
  const net::Header& h = m.header;
  ReplicaState state;
  {
    std::lock_guard lock(repl_mu_);
    auto it = incoming_meta_.find({from.rank, h.request_id});
    if (it == incoming_meta_.end()) {
      // Refused, not ignored: silence would hold the primary's round forever.
      PP_WARN("replica value {} from server {} without its metadata; refused", h.request_id,
              from.rank);
      std::string why = fmt::format("replica value {} without its metadata", h.request_id);
      net::Header err{.type = msg::kError, .request_id = h.request_id, .key = h.key};
      node_.transport().send_copy(m.conn, err, why.data(), why.size());
      return;
    }
    state = std::move(it->second);
    incoming_meta_.erase(it);
  }
  const bool dtype_ok = h.dtype <= 0xff && is_valid_dtype(static_cast<uint8_t>(h.dtype));
  auto dtype = static_cast<DType>(h.dtype);
  net::Header ack{.type = msg::kReply, .request_id = h.request_id, .key = h.key};
  const bool lent = (h.flags & msg::kFlagLent) != 0;
  // The value's bytes: the payload itself, or the lent range it names.
  net::LendRef ref;
  Status valid;
  if (!dtype_ok || h.length > static_cast<uint64_t>(INT64_MAX) / 8 ||
      h.offset > static_cast<uint64_t>(INT64_MAX)) {
    valid = {ErrorCode::kProtocolError, "bad dtype or size"};
  } else if (lent) {
    valid = net::decode_lend_ref({m.payload.data(), m.payload.size()}, &ref);
    if (valid && ref.bytes != h.length * dtype_size(dtype))
      valid = {ErrorCode::kProtocolError, "lent range is not the value's size"};
    // The bound a value sent by value has (the transport's message limit):
    // a reference must not make this node allocate more.
    else if (valid && ref.bytes > node_.options().net.max_message_bytes)
      valid = {ErrorCode::kProtocolError, "lent value larger than the message limit"};
  } else if (m.payload.size() != h.length * dtype_size(dtype)) {
    valid = {ErrorCode::kProtocolError, "bad dtype or size"};
  }
  if (!valid) {
    std::string why = fmt::format("replica of key id {}: {}", h.key, valid.message());
    ack.type = msg::kError;
    node_.transport().send_copy(m.conn, ack, why.data(), why.size());
    return;
  }
  // A lent value is copied on the part's thread, not on this (I/O) thread,
  // which has the workers' pushes and pulls to move meanwhile.
  std::function<Status()> fill;
  auto unreadable = std::make_shared<bool>(false);
  if (lent) {
    // Into a buffer of this node's (lending) pool, so that after a fail-over
    // this server can lend the value on in turn.
    m.payload = node_.transport().pool().acquire(ref.bytes);
    {
      std::lock_guard lock(repl_mu_);
      lent_by_[from.rank] = ref.pid;
    }
    fill = [this, ref, dst = m.payload.data(), unreadable] {
      Status st = lending() ? lend_reader_.copy(ref, dst)
                            : Status(ErrorCode::kIoError, "PUSHPULL_PS_LEND=0 on this server");
      *unreadable = !st.is_ok();
      return st;
    };
  }
  auto owner = std::make_shared<net::Buffer>(std::move(m.payload));
  state.value =
      Payload{ArrayView(owner->data(), dtype, Shape{static_cast<int64_t>(h.length)}), owner};
  PartId part{h.key, static_cast<int64_t>(h.offset)};
  int primary = from.rank;
  // The answer goes back on the connection the replica came in on, not
  // to the primary's rank: at the job's start this node (the connector
  // to lower ranks) may not have recorded that connection yet, and an
  // acknowledgement lost that way held the round, or the init, forever.
  // (A closed connection fails the send: that primary is gone.)
  net::ConnId back = m.conn;
  auto answer = [this, ack, primary, back, unreadable](const Status& s) {
    net::Header a = ack;
    if (s.is_ok()) {
      node_.transport().send_copy(back, a, nullptr, 0);
    } else if (*unreadable) {
      PP_INFO("server {}: replica from server {} not readable in place ({}); asking for bytes",
              node_.rank(), primary, s.message());
      a.flags = msg::kFlagSendBytes;
      node_.transport().send_copy(back, a, nullptr, 0);
    } else {
      PP_ERROR("cannot install a replica from server {}: {}", primary, s.to_string());
      a.type = msg::kError;
      node_.transport().send_copy(back, a, s.message().data(), s.message().size());
    }
  };
  store()->install_replica(part, std::move(state), std::move(answer), std::move(fill));
}

}  // namespace pushpull::ps
