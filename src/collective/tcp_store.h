// SPDX-License-Identifier: Apache-2.0
// TcpStore: the MASTER_ADDR store (store.h) of a group without a scheduler.
// Rank 0 hosts it at MASTER_ADDR:MASTER_PORT (on the listener `pushpull
// launch` or the torch backend handed down, else binding the port), in
// memory, over a transport::MessageTransport: every member authenticates with the job's
// hello (job id, secret) before any request is read. The other ranks are
// clients of it.
//
// Wire (net's collective range): kStoreSet {str key, value: the rest},
// kStoreGet {str key}; each answered by one kStoreReply with the request's
// request_id, flags = the error code (0: ok), payload = the value or the
// reason. A get of a key not set yet is answered when it is set.
//
// Who may do what, on the host: only workers of ranks 1..size-1, each once
// (transport::MessageTransport refuses a second connection of a rank), each setting only
// keys ending in "/<its rank>"; keys are write-once (store.h). A request
// that breaks this, or does not decode, is refused (told why) and closes
// that connection only: a stranger or a confused process never fails the
// meeting of the real members. A member that leaves while one of its gets
// is unanswered has died: the host's waits fail with PeerFailure naming it.
//
// Deadlines: connecting and every request are bounded (the caller's
// deadlines). The host's destructor lingers until every member that spoke
// to it left (so each has read its answer), at most until `linger_until`.
//
// Thread safety: as Store (one user thread); the Transport's I/O thread runs
// the handlers. Ownership: owns its Transport, sockets and thread.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collective/store.h"

namespace pushpull::transport {
class MessageTransport;
}

namespace pushpull::collective {

inline constexpr uint16_t kStoreSet = 130;
inline constexpr uint16_t kStoreGet = 131;
inline constexpr uint16_t kStoreReply = 132;

class TcpStore final : public Store {
 public:
  // o.collective's rank, size, master_addr and master_port; o.net's job id,
  // secret and limits. Rank 0 listens; the others connect (bounded by
  // `deadline`: Timeout / IoError when rank 0 is not there).
  TcpStore(const Options& o, Clock::time_point deadline);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, std::vector<std::byte> value) override;
  std::vector<std::byte> get(const std::string& key, Clock::time_point deadline) override;
  std::vector<std::string> wait(const std::vector<std::string>& keys,
                                Clock::time_point deadline) override;
  std::string where() const override;

  struct State;

 private:
  std::shared_ptr<State> st_;
  std::unique_ptr<transport::MessageTransport> t_;
  Clock::time_point linger_until_;
};

// A request's payload (exposed for the fuzz target): `value` null for a get.
std::vector<std::byte> encode_store_request(const std::string& key,
                                            std::span<const std::byte> value);
Status decode_store_request(std::span<const std::byte> in, bool with_value, std::string* key,
                            std::vector<std::byte>* value);

}  // namespace pushpull::collective
