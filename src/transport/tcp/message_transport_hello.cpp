// SPDX-License-Identifier: Apache-2.0
// MessageTransport: the acceptor side of the hello, on the I/O thread: refusing
// strangers, answering (and holding) hellos, duplicate identities. A stream
// hello's answer is in message_transport_stream.cpp.
#include <fmt/format.h>

#include "pushpull/log.h"
#include "transport/address.h"
#include "transport/tcp/conn.h"

namespace pushpull::transport {

// Closes a connection that has not authenticated: logged rate-limited per
// peer address, never reported to the close handler. `tell`: send the reason
// in a refusing ack first, so an honest but misconfigured peer learns why.
void MessageTransport::refuse_stranger(Conn& c, const std::string& reason, bool tell) {
  if (c.state != Conn::State::kHandshake) return;
  if (tell) send_hello_ack(c, reason, nullptr);
  refusals_.note(host_of(c.remote),
                 fmt::format("refused connection from {}: {}", c.peer.address, reason));
  close_conn(c, {ErrorCode::kProtocolError, reason}, false);
}

// Answers a hello: accepted (empty `reason`; `hello` is the accepted one and
// the ack carries this node's proof) or refused and why. Runs on the I/O thread.
void MessageTransport::send_hello_ack(Conn& c, const std::string& reason, const Hello* hello,
                                      SendDone written) {
  HelloAck ack{reason.empty(), reason, Role::kNone, -1, {}};
  {
    std::lock_guard lock(mu_);  // set_identity() may run concurrently
    ack.role = role_;
    ack.rank = rank_;
  }
  if (ack.accepted && hello != nullptr)
    ack.proof = compute_proof(config_.net.job_secret,
                              {Direction::kAcceptor, c.nonce, hello->nonce, config_.net.job_id,
                               ack.role, ack.rank, hello->kind});
  auto payload = encode(ack);
  SendOp op;
  op.header = encode_header(stamp(Header{.type = msg::kHelloAck}, payload.size()));
  op.owned = pool_.acquire(payload.size());
  std::memcpy(op.owned.data(), payload.data(), payload.size());
  op.data = op.owned.data();
  op.len = payload.size();
  op.done = std::move(written);
  enqueue(c, std::move(op), true);
}

// Why a peer at this connection's address may not even try (peer policy).
Status MessageTransport::refusal_for(const Conn& c) {
  if (!config_.net.job_secret.empty() || config_.net.allow_insecure) return Status::ok();
  if (from_this_machine(c.remote)) return Status::ok();
  return peer_refusal(c.remote, config_.net, local_hosts_);
}

bool MessageTransport::from_this_machine(const SockAddr& a) {
  if (is_local_peer(a, local_hosts_)) return true;
  auto now = std::chrono::steady_clock::now();
  if (now - local_hosts_at_ <= std::chrono::seconds(5)) return false;
  // Interfaces may have changed (or were never read): look again, at most every 5 s.
  local_hosts_.clear();
  for (const auto& i : list_interfaces())
    local_hosts_.push_back(i.address);
  local_hosts_at_ = now;
  return is_local_peer(a, local_hosts_);
}

void MessageTransport::on_hello(Conn& c, Message&& m) {
  Hello hello;
  Status st = decode(std::span<const std::byte>(m.payload.data(), m.payload.size()), &hello);
  // Ok while the stranger may go on: its address, its hello's form, then
  // what the hello proves.
  Status verdict = refusal_for(c);
  if (verdict && !st) verdict = st;
  if (verdict)
    verdict = check_hello(hello, c.nonce, config_.protocol_version, config_.net.job_id,
                          config_.net.job_secret);
  if (!verdict) {
    std::string reason = verdict.message();
    if (st)
      reason =
          fmt::format("{} (it claimed to be {} {})", reason, role_name(hello.role), hello.rank);
    return refuse_stranger(c, reason, true);
  }
  release_pending(c);  // it proved the secret: no longer a stranger's pending connection
  bool hold;
  {
    std::lock_guard lock(mu_);
    hold = config_.hold_hellos_until_ranked && rank_ < 0;
  }
  if (hold) {
    c.held = std::move(hello);
    held_count_++;
    return;
  }
  answer_hello(c, hello);
}

// Accepts an authenticated hello unless its identity is taken: any open
// connection with that peer, accepted or dialed by this node, holds it.
// (Connections this node dialed count too: otherwise a second connection
// claiming a peer this node dialed would be taken as that peer.) A peer that
// was replaced (worker restart, server rejoin) is no obstacle: the scheduler
// announced it and this node closed the old connection first (Node's
// apply_placement), or the old process died and its connections with it.
void MessageTransport::answer_hello(Conn& c, const Hello& hello) {
  if (hello.kind == HelloKind::kStream)
    return answer_stream(c, hello);  // message_transport_stream.cpp
  std::string taken;
  if (hello.role != Role::kNone && hello.rank >= 0) {
    std::lock_guard lock(mu_);
    for (auto& [id, other] : conns_)
      if (other.get() != &c && other->state == Conn::State::kOpen &&
          other->peer.role == hello.role && other->peer.rank == hello.rank)
        taken = fmt::format(
            "{} {} is already connected to this node ({} {}); a second connection claiming "
            "the same identity is refused",
            role_name(hello.role), hello.rank,
            other->peer.outgoing ? "dialed by this node, at" : "from", other->peer.address);
  }
  if (!taken.empty()) {
    PP_ERROR("refused connection from {}: {}", c.peer.address, taken);
    send_hello_ack(c, taken, nullptr);
    close_conn(c, {ErrorCode::kProtocolError, taken}, false);
    return;
  }
  send_hello_ack(c, {}, &hello);
  ConnectHandler h;
  {
    std::lock_guard lock(mu_);  // peer() reads it from other threads
    c.peer.role = hello.role;
    c.peer.rank = hello.rank;
    c.peer.host = hello.host;
    c.peer.port = hello.port;
    h = on_connect_;
  }
  c.peer_id = node_id(hello.role, hello.rank);
  release_pending(c);
  // Fixed buffers only now: a stream keeps the kernel's autotuning.
  tune_socket(c.fd.get(), config_.net.socket_buffer_bytes);
  c.state = Conn::State::kOpen;
  if (h) run_guarded(&c, "the connect handler", [&] { h(c.id, c.peer); });
}

void MessageTransport::release_held_hellos() {
  if (held_count_ == 0) return;
  std::vector<std::shared_ptr<Conn>> ready;
  {
    std::lock_guard lock(mu_);
    if (rank_ < 0) return;
    for (auto& [id, c] : conns_)
      if (c->held && c->state == Conn::State::kHandshake) ready.push_back(c);
  }
  for (auto& c : ready) {
    Hello hello = std::move(*c->held);
    c->held.reset();
    --held_count_;
    answer_hello(*c, hello);
  }
}

}  // namespace pushpull::transport
