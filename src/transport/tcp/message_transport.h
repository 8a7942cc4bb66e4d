// SPDX-License-Identifier: Apache-2.0
// MessageTransport: framed messages over TCP between pushpull nodes.
//
// One MessageTransport per node. It owns a listening socket, every connection of the
// node, and one I/O thread running an epoll loop over all of them. Every
// connection starts with the mutual hello of transport/hello.h; only connections
// that pass it reach the upper layers.
//
// Strangers. An accepted connection that has not authenticated yet is served
// concurrently with all others, has its own deadline (min(connect_timeout,
// handshake_timeout)) and may send at most one hello (kMaxHandshakeBytes).
// When it fails, times out or goes away it is closed and logged (at most one
// line per peer address every few seconds) and never reaches the connect or
// close handlers, so a stranger cannot fail a job. Without a job secret only
// peers on this machine may authenticate (transport/peer_policy.h). A (role,
// rank >= 0) that already has an open accepted connection here cannot be
// claimed again. With TransportConfig::hold_hellos_until_ranked, a node
// whose rank is still -1 holds incoming hellos until set_identity() gives it
// a rank, so connectors always learn a ranked identity.
//
// Identity. The `sender` field of every delivered message (handlers and
// posted receives) is transport::node_id() of the connection's authenticated peer,
// whatever the peer wrote there.
//
// Sending. send() queues header + payload as one writev straight from the
// caller's buffer (no copy); the caller keeps the buffer alive and unchanged
// until `done` runs. When the connection's queue is empty the calling thread
// writes at once, so small messages need no thread hop; what the socket does
// not take is finished by the I/O thread on EPOLLOUT. Among queued messages a
// higher `priority` goes first (equal priorities keep call order; a message
// already partly written always finishes first). send_copy() copies a small
// payload into a pooled buffer instead (control messages).
//
// Receiving. For every complete message the handler registered for its type
// runs on the I/O thread with the payload in a pooled Buffer (moved in; keep
// or drop it). To read a payload straight into place instead, post_recv() a
// destination for an expected message, matched by (connection, type,
// request_id, key) exactly: e.g. the ring's "segment k of op X from my left
// neighbour" is (left conn, kRingData, X, k), the PS pull reply is (server
// conn, kPullReply, request id, key). A matching message arriving before its
// post goes to the handler instead, which must cope (copy it), so post early.
//
// Errors. Malformed input (bad magic/version, oversize length, unknown type,
// garbage) closes only that connection, logs a ProtocolError and the node
// keeps serving the others. So does an exception thrown by a handler, a
// connect handler or a completion on the I/O thread (logged as an error). A
// closed connection fails its queued sends and posted receives with the
// reason and calls the close handler. When accept() runs out of descriptors
// or memory the listener pauses (100 ms doubling to 1 s) instead of spinning.
//
// Threading. Handlers, the connect handler and the close handler run on the
// I/O thread: they must not block (hand long work to another thread); they
// may call send(), send_copy(), post_recv() and close(). send()'s `done` runs
// exactly once, either on the calling thread before send() returns or on the
// I/O thread; a RecvDone runs on the I/O thread (or on the caller of
// post_recv when it fails at once). All public methods are thread-safe except
// listen(), the set_*handler() calls and start(): call those during setup,
// from one thread, before any connection exists. connect() blocks (bounded by
// NetOptions::connect_timeout) and must not be called on the I/O thread.
//
// Same host. With TransportConfig::shared_memory, a connection whose peer
// turns out to run on this host (it proves it by mapping a segment this node
// created, transport/shm/shm_setup.h) moves message payloads through a pair of
// shared-memory rings while headers, order and liveness stay on TCP: a
// closed TCP connection still fails everything pending, and a peer that
// dies mid-payload is noticed the same way. connect() returns once the setup
// settled (bounded by the connect deadline). Everything above is unchanged:
// send() copies the payload into the ring instead of the socket, a posted
// receive is filled from the ring. Payload bytes sent each way are counted
// in the metrics net_shm_bytes / net_tcp_bytes (base/metrics.h).
//
// Streams. A connection can also become a data stream that its owner drives
// from its own thread (the collectives' StreamPump): open_stream() dials the
// same listening port and runs the same hello (with TLS, the same TLS first)
// marked HelloKind::kStream, which both proofs bind. The acceptor serves it
// like any stranger (deadlines, refusal logs, per-source limits, the
// local-only rule without a secret), accepts it only from a peer of rank in
// [0, TransportConfig::stream_ranks) other than itself, at most once per
// (role, rank) for this transport's life, and once the ack is written takes
// the socket (and its TLS link) out of its loop and queues it for
// take_stream() (untaken ones, at most stream_ranks, until stop()). Nothing else of this class
// touches a stream: every message on it is a 64-byte header (type msg::kStreamData, request_id =
// the tag, payload_bytes) then the payload, checked with decode_header(), and the owner closes it.
//
// In-process medium. listen("inproc", n) and connect("inproc", n) put every
// connection on a socketpair instead of TCP, with no listening socket
// (transport/inproc/in_process_listeners.h); everything above is unchanged.
//
// Ownership. The MessageTransport owns its sockets and thread; the destructor stops
// the loop, closes every connection and joins the thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/options.h"
#include "transport/buffer_pool.h"
#include "transport/hello.h"
#include "transport/message.h"
#include "transport/node_id.h"
#include "transport/peer_policy.h"
#include "transport/socket.h"
#include "transport/tcp/transport_config.h"
#include "transport/tls.h"

namespace pushpull::transport {

using ConnId = uint64_t;
struct SendOp;

// Who is at the other end of a connection (from its hello).
struct PeerInfo {
  Role role = Role::kNone;
  int32_t rank = -1;
  std::string host;       // advertised listening host of the peer
  int32_t port = 0;       // advertised listening port (0: none)
  std::string address;    // the socket's remote address "ip:port"
  bool outgoing = false;  // we connected to it
  // "worker 2 (host 10.0.0.2:9000)".
  std::string describe() const;
};

// A data stream (see "Streams"): a connected socket out of any epoll loop,
// its TLS link when TLS is on (every byte on fd then goes through it), and
// the peer it authenticated. Owned by whoever took it.
struct Stream {
  Fd fd;
  std::unique_ptr<TlsLink> tls;
  PeerInfo peer;
};

struct Message {
  ConnId conn = 0;
  Header header;
  Buffer payload;
};

struct RecvMatch {
  uint16_t type = 0;
  uint64_t request_id = 0;
  uint64_t key = 0;
  bool operator==(const RecvMatch&) const = default;
};

using Handler = std::function<void(Message&&)>;
using SendDone = std::function<void(const Status&)>;
using RecvDone = std::function<void(const Status&, const Header&)>;
using ConnectHandler = std::function<void(ConnId, const PeerInfo&)>;
using CloseHandler = std::function<void(ConnId, const PeerInfo&, const Status&)>;

class MessageTransport {
 public:
  explicit MessageTransport(TransportConfig config);
  ~MessageTransport();
  MessageTransport(const MessageTransport&) = delete;
  MessageTransport& operator=(const MessageTransport&) = delete;

  // Binds the listening socket (setup only). `host` empty: all IPv4
  // addresses (see bind_host_for() in transport/peer_policy.h). Returns the bound
  // port (a free one when `port` is 0).
  int listen(const std::string& host, int port);
  // Listens on a socket bound and listening already (listen_on(), or one
  // inherited from the launcher: take_inherited_listener()); takes it over.
  // Returns its port.
  int listen(Fd listening);
  int port() const { return port_; }

  // Handler for message types [first, last] (setup only; < 256).
  void set_handler(uint16_t first, uint16_t last, Handler handler);
  // After an accepted connection passed its hello.
  void set_connect_handler(ConnectHandler h);
  // After a connection that passed its hello closed for any reason other than stop().
  void set_close_handler(CloseHandler h);
  // What this node says about itself in hellos and headers (thread-safe).
  // Releases hellos held while this server or worker had no rank.
  void set_identity(Role role, int32_t rank, uint32_t sender_id);
  void set_advertised_address(const std::string& host, int port);

  // Starts the I/O thread.
  void start();
  // Closes everything, fails pending operations with `reason`, joins the
  // thread. Idempotent. No close handlers run.
  void stop();

  // Connects to host:port, retrying refused/unreachable attempts with backoff
  // until `timeout` (NetOptions::connect_timeout when not given), then runs
  // the hello. Throws Timeout naming the address when nobody answered,
  // ProtocolError when the peer refused us (never retried), IoError.
  ConnId connect(const std::string& host, int port, std::optional<Millis> timeout = {});

  // Opens a data stream to the node at host:port, which must prove it is
  // (role, rank): dials and says hello as connect() does (same deadline,
  // retries and errors; ProtocolError also when the acceptor is someone
  // else). Blocks; not on the I/O thread. Thread-safe.
  Stream open_stream(const std::string& host, int port, Role role, int32_t rank,
                     std::optional<Millis> timeout = {});
  // The stream that (role, rank) opened to this node, once its ack is
  // written (with TLS, flushed until `deadline`). Timeout at `deadline`,
  // IoError after stop(). Thread-safe.
  Status take_stream(Role role, int32_t rank, std::chrono::steady_clock::time_point deadline,
                     Stream* out);

  // Zero-copy send of `n` bytes at `data` (see above). Header fields magic,
  // version, sender and payload_bytes are filled in.
  void send(ConnId conn, Header header, const void* data, size_t n, SendDone done,
            int priority = 0);
  // Copying send for small messages; an error when the connection is gone.
  Status send_copy(ConnId conn, Header header, const void* data, size_t n, int priority = 0);

  // Posts a destination for the next message matching (conn, match); returns
  // an error (and does not call `done`) when the connection is closed or the
  // same match is already posted. A payload larger than `capacity` fails
  // `done` with ProtocolError and is dropped.
  Status post_recv(ConnId conn, RecvMatch match, void* dst, size_t capacity, RecvDone done);
  // Removes a posted receive that has not started; true when removed.
  bool cancel_recv(ConnId conn, RecvMatch match);

  // Closes one connection (asynchronously, on the I/O thread).
  void close(ConnId conn, Status reason);
  // Waits until every queued send has been written; false at the deadline.
  bool drain(Millis timeout);

  // Binds an accepted connection whose peer said hello without a rank (a node
  // registering with the scheduler) to the rank the upper layer assigned it:
  // from then on its messages carry that identity and a second connection
  // claiming the same (role, rank) is refused. False when the connection is
  // gone or already has another rank. Thread-safe.
  bool bind_peer_rank(ConnId conn, int32_t rank);
  std::optional<PeerInfo> peer(ConnId conn) const;
  std::vector<ConnId> connections() const;
  // Sets SO_SNDBUF and SO_RCVBUF of one connection (bytes <= 0 or an unknown
  // connection: nothing), as NetOptions::socket_buffer_bytes does for all.
  void set_socket_buffer(ConnId conn, int bytes);
  // The connection's SO_RCVBUF as the kernel reports it (twice what was set),
  // or 0 for an unknown connection.
  int socket_receive_buffer(ConnId conn) const;
  BufferPool& pool() { return pool_; }
  const TransportConfig& config() const { return config_; }

  struct Conn;
  struct Dialed;

 private:
  // The connector's side of the hello (message_transport_connect.cpp): dials
  // host:port with retries and says hello as `kind`, until the timeout.
  Dialed dial_hello(const std::string& host, int port, Millis limit, HelloKind kind);
  // The acceptor's side of a stream hello, and the hand-over once its ack
  // is written (message_transport_stream.cpp). I/O thread.
  void answer_stream(Conn& c, const Hello& hello);
  void hand_over_stream(ConnId id, uint32_t peer_id);
  std::shared_ptr<Conn> find(ConnId id) const;
  void loop();
  void accept_all();
  // The dialers' ends of in-process socketpairs (listen("inproc", ...)),
  // queued by in_process::dial, served as accepted connections. I/O thread.
  void accept_adopted();
  // An accepted connection from `remote` becomes a stranger that must say
  // hello (the per-source limit, TLS, the challenge). I/O thread.
  void admit(Fd fd, const SockAddr& remote);
  void on_readable(Conn& c);
  // The acceptor's TLS handshake step; false while it is not done (or failed).
  bool tls_accept_step(Conn& c);
  void read_again_later(Conn& c);
  void on_header(Conn& c);
  void finish_message(Conn& c);
  void on_hello(Conn& c, Message&& m);
  void answer_hello(Conn& c, const Hello& hello);
  void release_held_hellos();
  void send_hello_ack(Conn& c, const std::string& reason, const Hello* hello,
                      SendDone written = {});
  void refuse_stranger(Conn& c, const std::string& reason, bool tell);
  Status refusal_for(const Conn& c);
  // True for loopback and this machine's own addresses (re-read at most
  // every 5 s when an address is not among them). I/O thread.
  bool from_this_machine(const SockAddr& a);
  // Takes `c` out of the per-source count of pending connections (it
  // authenticated, or closed). I/O thread.
  void release_pending(Conn& c);
  std::byte* payload_room(Conn& c, size_t* room);
  bool run_guarded(Conn* c, const char* what, const std::function<void()>& f);
  void pause_listener(int error);
  void resume_listener_if_due();
  // I/O thread: writes what the socket takes; on a send error delivers what
  // the peer still sent (drain_before_close, at most kDrainRounds reads of
  // the read budget), then closes.
  void flush(Conn& c);
  void drain_before_close(Conn& c);
  static constexpr int kDrainRounds = 16;
  void close_conn(Conn& c, const Status& why, bool notify);
  void arm_output(Conn& c);
  ConnId add_conn(std::shared_ptr<Conn> c);
  void enqueue(Conn& c, SendOp&& op, bool from_io_thread);
  // Shared memory (shm/message_transport_shm.cpp).
  enum class WriteState { kIdle, kSocketFull, kRingFull, kError };
  WriteState write_some(Conn& c, std::vector<SendOp>& completed);
  bool write_tcp_batch(Conn& c, std::vector<SendOp>& completed, bool* would_block);
  bool fill_piece(Conn& c, SendOp& op);
  void after_write(Conn& c, WriteState r);
  void complete_sends(Conn* c, std::vector<SendOp>& completed);
  void queue_ctl(Conn& c, Header h, const std::vector<std::byte>& payload, bool activates);
  void queue_release(Conn& c, uint64_t pos);
  void offer_shm(Conn& c);
  void wait_shm_settled(Conn& c, std::chrono::steady_clock::time_point deadline);
  void settle_shm(Conn& c);
  bool on_shm_frame(Conn& c, const Header& h);
  void on_shm_setup(Conn& c, Message&& m);
  void shm_protocol_error(Conn& c, const std::string& what);
  void wake();
  Header stamp(Header h, size_t n) const;
  std::shared_ptr<Handler> handler(uint16_t type) const;

  TransportConfig config_;
  BufferPool pool_;
  Fd listen_fd_;
  int port_ = 0;
  bool in_process_ = false;  // listening on the in-process medium (port_ is its number)
  Fd epoll_fd_;
  Fd wake_fd_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  bool started_ = false;

  mutable std::mutex mu_;  // guards the members below
  std::unordered_map<ConnId, std::shared_ptr<Conn>> conns_;
  ConnId next_id_ = 1;
  std::vector<std::pair<ConnId, Status>> to_close_;
  std::vector<Fd> adopted_;  // in-process dialers' ends, for accept_adopted()
  std::shared_ptr<Handler> handlers_[256];
  ConnectHandler on_connect_;
  CloseHandler on_close_;
  Role role_;
  int32_t rank_;
  uint32_t sender_ = 0;
  std::string adv_host_;
  int adv_port_ = 0;

  // I/O thread only.
  RefusalLog refusals_;
  bool listen_paused_ = false;
  std::chrono::steady_clock::time_point listen_resume_{};
  Millis accept_backoff_{100};
  std::chrono::steady_clock::time_point accept_log_next_{};
  uint64_t accept_failures_ = 0;  // since the last accept-failure log line
  size_t held_count_ = 0;         // connections with a held hello
  PendingLimit pending_;          // unauthenticated connections per source address (other machines)
  std::vector<std::string> local_hosts_;  // this machine's addresses (peer policy)
  std::chrono::steady_clock::time_point local_hosts_at_{};

  std::vector<std::shared_ptr<Conn>> graveyard_;  // closed this loop turn (guarded by mu_)
  // Connections whose TLS link holds received records the socket no longer
  // signals (transport/tls.h): read again without waiting (guarded by mu_).
  std::vector<ConnId> read_again_;
  std::shared_ptr<const TlsContext> tls_;  // null without PUSHPULL_TLS
  // Streams (message_transport_stream.cpp): the node ids that opened one here
  // (guarded by mu_), and those handed over and not taken yet.
  std::unordered_set<uint32_t> stream_peers_;
  std::mutex streams_mu_;
  std::condition_variable streams_cv_;
  std::vector<Stream> streams_in_;  // guarded by streams_mu_
  std::atomic<int64_t> queued_{0};  // sends not yet completed (for drain)
};

}  // namespace pushpull::transport
