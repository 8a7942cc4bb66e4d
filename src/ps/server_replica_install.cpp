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
namespace {

// A lent value held in place (transport::LendReader::pin): keeps the primary's
// block mapped, and tells the primary when the last reference goes, so that
// it may update or reuse that memory again.
class PinnedValue {
 public:
  PinnedValue(std::shared_ptr<const std::byte> range, std::function<void()> release)
      : range_(std::move(range)), release_(std::move(release)) {}
  ~PinnedValue() {
    try {
      release_();
    } catch (const std::exception& e) {
      PP_DEBUG("replica release not sent: {}", e.what());
    }
  }
  PinnedValue(const PinnedValue&) = delete;
  PinnedValue& operator=(const PinnedValue&) = delete;
  // Mapped read-only: Payload::read_only keeps the store from writing it.
  void* data() const { return const_cast<std::byte*>(range_.get()); }

 private:
  std::shared_ptr<const std::byte> range_;
  std::function<void()> release_;
};

}  // namespace

void Server::on_replica_value(const cluster::NodeAddress& from, transport::Message&& m) {
  const transport::Header& h = m.header;
  // Refused, not ignored: silence would hold the primary's round forever.
  auto refuse = [&](const std::string& why) {
    PP_WARN("replica {} from server {} refused: {}", h.request_id, from.rank, why);
    transport::Header err{.type = msg::kError, .request_id = h.request_id, .key = h.key};
    node_.transport().send_copy(m.conn, err, why.data(), why.size());
  };
  ReplicaState state;
  transport::LendRef ref;
  const bool with_meta = (h.flags & msg::kFlagWithMeta) != 0;
  if (with_meta) {
    // Lent, with its metadata behind the reference (no kReplicaMeta).
    Status st = (h.flags & msg::kFlagLent)
                    ? decode_lent_replica({m.payload.data(), m.payload.size()}, node_.num_workers(),
                                          &ref, &state)
                    : Status(ErrorCode::kProtocolError, "metadata without a lent reference");
    if (!st) return refuse(fmt::format("replica {}: {}", h.request_id, st.message()));
  } else {
    std::lock_guard lock(repl_mu_);
    auto it = incoming_meta_.find({from.rank, h.request_id});
    if (it == incoming_meta_.end())
      return refuse(fmt::format("replica value {} without its metadata", h.request_id));
    state = std::move(it->second);
    incoming_meta_.erase(it);
  }
  const bool dtype_ok = h.dtype <= 0xff && is_valid_dtype(static_cast<uint8_t>(h.dtype));
  auto dtype = static_cast<DType>(h.dtype);
  transport::Header ack{.type = msg::kReply, .request_id = h.request_id, .key = h.key};
  const bool lent = (h.flags & msg::kFlagLent) != 0;
  // The value's bytes: the payload itself, or the lent range it names
  // (decoded above when the metadata came with it).
  Status valid;
  if (!dtype_ok || h.length > static_cast<uint64_t>(INT64_MAX) / 8 ||
      h.offset > static_cast<uint64_t>(INT64_MAX)) {
    valid = {ErrorCode::kProtocolError, "bad dtype or size"};
  } else if (lent) {
    if (!with_meta) valid = transport::decode_lend_ref({m.payload.data(), m.payload.size()}, &ref);
    if (valid && ref.bytes != h.length * dtype_size(dtype))
      valid = {ErrorCode::kProtocolError, "lent range is not the value's size"};
    // The bound a value sent by value has (the transport's message limit):
    // a reference must not make this node map or hold more.
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
  // A lent value is pinned on the part's thread, not on this (I/O) thread,
  // which has the workers' pushes and pulls to move meanwhile. Nothing is
  // copied: the backup reads the primary's buffer in place (mapped, it stays
  // readable if the primary dies), and the primary leaves it unchanged until
  // told (kReplicaRelease) that this server dropped it.
  std::function<Status(ReplicaState&)> fill;
  auto unreadable = std::make_shared<bool>(false);
  const int64_t count = static_cast<int64_t>(h.length);
  if (lent) {
    {
      std::lock_guard lock(repl_mu_);
      lent_by_[from.rank] = ref.pid;
    }
    fill = [this, ref, dtype, count, unreadable, back = m.conn, id = h.request_id,
            key = h.key](ReplicaState& s) {
      std::shared_ptr<const std::byte> range;
      Status st = lending() ? lend_reader_.pin(ref, &range)
                            : Status(ErrorCode::kIoError, "PUSHPULL_PS_LEND=0 on this server");
      if (!st) {
        *unreadable = true;
        return st;
      }
      auto release = [this, gate = gate_, back, id, key, ref] {
        if (!gate->enter()) return;  // this server is going away
        transport::Header rel{.type = msg::kReplicaRelease, .request_id = id, .key = key};
        std::vector<std::byte> bytes = transport::encode_lend_ref(ref);
        // Fails at once when the primary is gone: nothing to tell it then.
        (void)node_.transport().send_copy(back, rel, bytes.data(), bytes.size());
        gate->leave();
      };
      auto pinned = std::make_shared<PinnedValue>(std::move(range), std::move(release));
      s.value = Payload{ArrayView(pinned->data(), dtype, Shape{count}), pinned, true};
      return Status::ok();
    };
  } else {
    auto owner = std::make_shared<transport::Buffer>(std::move(m.payload));
    state.value = Payload{ArrayView(owner->data(), dtype, Shape{count}), owner};
  }
  PartId part{h.key, static_cast<int64_t>(h.offset)};
  int primary = from.rank;
  // The answer goes back on the connection the replica came in on, not
  // to the primary's rank: at the job's start this node (the connector
  // to lower ranks) may not have recorded that connection yet, and an
  // acknowledgement lost that way held the round, or the init, forever.
  // (A closed connection fails the send: that primary is gone.)
  transport::ConnId back = m.conn;
  auto answer = [this, ack, primary, back, unreadable, lent](const Status& s) {
    transport::Header a = ack;
    if (s.is_ok()) {
      if (lent) a.flags = msg::kFlagPinned;
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
