// SPDX-License-Identifier: Apache-2.0
// The collective Transport over TCP (transport/tcp/message_transport.h): one
// transport::MessageTransport per rank, at most one connection per pair of ranks, always opened by
// the higher rank (so a pair never gets two; net's duplicate-identity check refuses a second claim
// anyway).
//
// Not a full mesh (tcp_transport_mesh.cpp chooses, tcp_transport_connect.cpp
// connects): connect_all opens, in parallel, only the connections the
// algorithms use (mesh_partners: ring neighbours, every rank 2^k away either
// way, halving-doubling partners, the ranks of a small host, a uniform
// layout's hierarchical subgroups), O(log n) per rank, and the direct
// streams of those pairs. Any other pair connects on its
// first post_send/post_recv (alltoall, process sets, the engine's
// negotiation): operations with a peer not connected yet wait in order;
// the higher rank dials at once, the lower one asks it to (kDialMeType,
// routed over the partner links: O(log n) hops). A lazy connection that
// cannot be opened within LivenessConfig::heartbeat_timeout + 2 s (at most
// the connect timeout) fails those operations with a PeerFailure naming the
// peer, as a lost connection would.
//
// Zero copy both ways for data: sends writev() straight from the caller's
// buffer; a data receive is posted to net so its payload is read straight
// into the destination. A message that arrives before its receive is posted
// lands in a pooled buffer and is copied when the receive comes (control
// messages, whose tags repeat, always take that path so a stale posting can
// never capture a later message).
//
// Data streams (tcp_streams.h): connect_all also opens one more TCP
// connection per pair of partners (mesh_partners; stream_fd() is -1 for any
// other peer, and a subgroup with such a pair moves its data over net): the
// higher rank opens it to the lower one's net port with the same hello,
// marked as a stream (transport::MessageTransport::open_stream), and the lower
// rank's MessageTransport hands it over (take_stream; only ranks of this
// group, once each). On them run() drives every collective's schedule
// directly from the calling thread (StreamPump; large rings add a
// StreamWriter thread) for speed. One operation uses them at a time
// (lock_streams()); post_send/post_recv keep going over net, so the engine's
// control traffic never mixes with them.
//
// Failure detection (start_liveness, after connect_all): the shared detector
// (transport/liveness.h) on the ring, wired in tcp_transport_liveness.cpp.
// Each rank beats (kHeartbeatType) once per heartbeat_interval to its ring
// predecessor, which watches it (any message from it is a sign of life): a
// constant load per rank. A successor silent for heartbeat_timeout is probed
// directly and through two helpers holding links to both (its successor,
// this rank's predecessor), and declared dead when no answer comes within
// the probe window: a stopped or unreachable rank, whatever it was doing,
// never a slow link between two. A rank answers probes only while its
// detector runs. Other peers are not timed: their death is a closed
// connection (a suspect, below) or their watcher's verdict.
//
// The verdict: the job's first failure as this rank knows it. Once decided,
// every pending and later operation, with every peer, fails with it (a
// PeerFailure naming the node that failed: "rank 2 (host h:p) failed: ..."),
// stream waits end with it, and it is sent to every peer (kVerdictType)
// before anything closes, so survivors blame the node that failed first, not
// the rank that detected it. A verdict from a peer is adopted unless one was
// already decided, and passed on to every peer once (so it floods a group
// that is not fully connected). A closed connection is only a suspect: its operations are
// held for `grace` in case a verdict naming another node arrives (a peer that
// exits because of someone else's death closes its connections too); then
// the peer is blamed. abort(why) decides `why` as this rank's own failure
// (unless a verdict exists), tells the peers, then closes. declare(why)
// decides an outside verdict (the cluster Node's, in cluster mode).
//
// Memory: messages that arrive before their receive is posted are kept per
// peer up to LivenessConfig::early_messages / early_bytes; a peer over either
// limit has broken the protocol: its connection is closed (ProtocolError).
//
// close() without a verdict first says goodbye (kByeType) to the peers: they
// fail their operations with this rank at once, without suspecting it.
// close() stops the heartbeat thread and the net transport (its thread
// joined, every pending completion run) before returning. Only the first call
// does that; a later or concurrent one returns at once, possibly before the
// first has finished, so whoever destroys the transport closes it from the
// owning thread (the communicator's shutdown, the destructor), not from a
// callback.
//
// Threads: the net I/O thread, the heartbeat thread (start_liveness), and up
// to kLazyDialers dialer threads started on the first lazy connection; all
// joined by close().
//
// Thread safety: everything is thread-safe after connect_all().
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "transport/liveness.h"
#include "transport/socket.h"
#include "transport/tcp/message_transport.h"
#include "transport/tcp/tcp_streams.h"
#include "transport/transport.h"
#include "transport/worker_thread.h"

namespace pushpull::transport {

// Data messages over the net connections (type 128).
inline constexpr uint16_t kDataType = transport::msg::kCollectiveFirst;

// Message types of the failure detector (net's collective range; see
// bootstrap.h for the others).
inline constexpr uint16_t kHeartbeatType = 133;
inline constexpr uint16_t kVerdictType = 134;
inline constexpr uint16_t kByeType = 135;  // close() without a failure: not a suspect
// The indirect probe of a silent ring successor (SWIM-style; payload: the
// requester's and the target's rank, u32 LE each): "probe" asks the target
// for an "ack"; a "probe request" asks a helper to probe the target for the
// requester, and the helper relays the target's ack to the requester.
inline constexpr uint16_t kProbeType = 136;
inline constexpr uint16_t kProbeReqType = 137;
inline constexpr uint16_t kProbeAckType = 138;
// "Dial me": payload from, to (u32 LE); forwarded over partner links until
// it reaches `to`, which (the higher of the two) dials `from`.
inline constexpr uint16_t kDialMeType = 139;
// A host with at most this many ranks has all of them connected at start-up.
inline constexpr int kMaxLocalMesh = 16;
// A group this small is fully connected (cheap, and no subgroup of it can
// see streams on some pairs only).
inline constexpr int kFullMeshUpTo = 8;
// Lazy connections are dialed by at most this many threads at once.
inline constexpr int kLazyDialers = 4;

// The peers `rank` connects at start-up (ascending, without itself), for the
// ranks' hosts `hosts` (the book's; size = the group's): everyone up to
// kFullMeshUpTo ranks; else ring neighbours and every rank 2^k away either
// way (ring, binomial broadcast from any root, barrier), its
// halving-doubling partners (the fold of a size that is not a power of two),
// the other ranks of its host when that host has at most kMaxLocalMesh, and,
// when every one of several hosts has the same number (>= 2) of ranks, the
// hierarchical allreduce's subgroups: all of its host's ranks and the ranks
// of the same local index on the other hosts (hosts + ranks per host links).
// Symmetric: q is among p's exactly when p is among q's. A subgroup
// (SubgroupTransport) then either has streams on every pair or every member
// misses one, so its members agree on using them.
std::vector<int> mesh_partners(int rank, const std::vector<std::string>& hosts);
// Heartbeats, verdicts and goodbyes jump ahead of queued data on a connection.
inline constexpr int kUrgentPriority = 1 << 20;
// A verdict's text is cut to this (a bound for the receiver too).
inline constexpr size_t kMaxVerdictBytes = 4096;

struct LivenessConfig {
  // Heartbeats and the silence limit; detect = false only holds suspects
  // (another detector, e.g. the cluster's scheduler, declares).
  bool detect = true;
  Millis heartbeat_interval{2000};
  Millis heartbeat_timeout{10000};
  // How long a closed connection's operations wait for a better verdict.
  Millis grace{1000};
  // How long a silent successor may answer the probes before it is declared
  // (0: 2 heartbeat intervals, at least 100 ms, at most 1 s).
  Millis probe_window{0};
  // How failure messages name the members ("rank", or "worker" in a cluster),
  // and, when not empty, each member's full name by rank (in a cluster the
  // Node's "worker 2 (host h:p)", so both detectors name a node alike).
  std::string noun = "rank";
  std::vector<std::string> names;
  // Early-message limits per peer.
  size_t early_messages = 65536;
  uint64_t early_bytes = uint64_t{1} << 30;
  const ClockSource* clock = &steady_clock_source();
};

class TcpTransport;

// A handle on a TcpTransport that outlives it: the cluster Node's failure
// callback (on the Node's thread) forwards verdicts through it; after the
// transport is gone deliver() does nothing. Thread-safe.
class VerdictPort {
 public:
  void deliver(const Status& verdict);

 private:
  friend class TcpTransport;
  std::mutex mu_;
  TcpTransport* target_ = nullptr;
};

class TcpTransport final : public Transport {
 public:
  // Listens on host:port (0 = a free port) as `rank` of `size`; host
  // "inproc": on the in-process medium (tests; the port is then chosen).
  TcpTransport(int rank, int size, const NetOptions& net, const std::string& host = "127.0.0.1",
               int port = 0);
  // Listens on `listener`, bound and listening already (its port published
  // before this transport exists, e.g. in an elastic round's book); `host`
  // is where it was bound (an invalid `listener` with host "inproc": the
  // in-process medium).
  TcpTransport(int rank, int size, const NetOptions& net, const std::string& host,
               transport::Fd listener);
  ~TcpTransport() override;

  int port() const { return net_.port(); }
  // book[r] = (host, port) of rank r. Connects to its lower mesh_partners
  // (in parallel, at most 16 dials at once) and waits for its higher ones,
  // all within net.connect_timeout, then opens their data streams; throws
  // Timeout naming the missing ranks. Other peers connect lazily (above).
  void connect_all(const std::vector<std::pair<std::string, int>>& book);
  // Peers with an open connection now (tests count them).
  int connected_peers() const;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void post_send(int peer, uint64_t tag, const void* data, size_t bytes, Completion done) override;
  void post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) override;
  void close(const Status& reason) override;
  void abort(const Status& why) override;

  // Starts the failure detector (see above); call once, after connect_all.
  void start_liveness(LivenessConfig config);
  // Decides `verdict` (unless one exists): fails every operation with it and
  // tells the peers. Thread-safe; not from a completion of this transport.
  void declare(const Status& verdict);
  // The verdict, once decided.
  std::optional<Status> verdict() const;
  // Heartbeats this rank has sent (the detector's load; tests count them).
  uint64_t heartbeats_sent() const { return heartbeats_sent_.load(std::memory_order_relaxed); }
  // Called once with the verdict when it is decided (from whichever thread
  // decides it, no lock held): a transport layered on this one (ShmDataTransport)
  // fails its own operations with it. Set before operations start.
  void on_verdict(std::function<void(const Status&)> fn) {
    std::lock_guard lock(mu_);
    on_verdict_ = std::move(fn);
  }
  std::shared_ptr<VerdictPort> verdict_port() const { return port_; }

  // Collectives: on the data streams (see above) once connect_all() opened
  // them (run_on_streams), else with post_send/post_recv.
  void run(const Schedule& s) override;
  bool runs_direct_to(int peer) const override { return stream_fd(peer) >= 0; }
  bool has_streams() const { return streams_ready_; }
  // -1 when there is no stream to `peer`.
  int stream_fd(int peer) const;
  transport::TlsLink* stream_tls(int peer) const;
  // Held by an algorithm for the whole of its use of the streams.
  std::unique_lock<std::mutex> lock_streams() { return std::unique_lock(stream_mu_); }
  // True once closed or a verdict is decided (stream waits end then).
  bool is_closed() const;
  // The error of a failed stream operation with `peer`: the closing reason
  // after close(), the verdict once decided, else `code` naming the peer and
  // `why`. For a peer failure with no verdict yet it waits up to the grace
  // for a verdict naming another node, then blames `peer`. Called by the
  // thread that drives the streams.
  Status stream_error(int peer, const std::string& why, ErrorCode code = ErrorCode::kPeerFailure);
  // "rank 2 (host 10.0.0.2:9000)".
  std::string describe(int peer) const;

 private:
  // Opens the data streams with `partners` (mesh_partners).
  void setup_streams(const std::vector<std::pair<std::string, int>>& book,
                     const std::vector<int>& partners);
  using Key = std::pair<int, uint64_t>;
  struct Posted {
    void* dst;
    size_t bytes;
    Completion done;
  };
  void on_message(transport::Message&& m);
  void on_control(transport::Message&& m);
  void on_net_recv(Key key, const Status& st, const transport::Header& h);
  void on_close(transport::ConnId id, const Status& st);
  Status peer_error(int peer, const Status& why) const;
  // A failed operation with `peer`: fails it with the verdict, or holds it
  // (suspecting the peer) until one is decided. mu_ not held.
  void fail_or_hold(int peer, Completion done, const Status& why);
  // Decides `verdict`, tells the peers (`tell`), fails everything. mu_ not held.
  void decide(const Status& verdict, bool tell);
  // One event of the detector (the liveness thread; mu_ held on entry and
  // exit, released while sending or deciding).
  void on_liveness(transport::Liveness::Event&& e, std::unique_lock<std::mutex>& lock);
  // Lazy connections (tcp_transport_connect.cpp). An operation with a peer
  // not connected yet (or with earlier ones still waiting) is queued.
  struct Deferred {
    bool send;
    uint64_t tag;
    const void* src;
    void* dst;
    size_t bytes;
    Completion done;
  };
  bool defer(int peer, Deferred& d);    // mu_ held; true: queued
  void request_connection(int peer);    // mu_ held
  void flush(int peer);                 // mu_ not held: runs the queued operations in order
  void lazy_loop();                     // a dialer thread
  void dial(int peer);                  // mu_ not held
  void send_dial_me(int from, int to);  // mu_ not held
  void on_dial_me(const transport::Message& m, int from);  // mu_ not held
  void lazy_failed(int peer, Status why);                  // mu_ not held: fails its queue
  std::vector<Deferred> take_deferred();                   // mu_ held: every queued operation
  // Why an operation with `peer` cannot be posted (closed, a verdict, no
  // such peer), or ok. Under mu_.
  Status refusal_locked(int peer) const;
  void post_send_now(int peer, uint64_t tag, const void* data, size_t bytes, Completion done,
                     bool flushing);
  void post_recv_now(int peer, uint64_t tag, void* dst, size_t bytes, Completion done,
                     bool flushing);
  Millis lazy_timeout() const;                      // mu_ held
  void on_probe(transport::Message&& m, int from);  // mu_ not held
  void heard(transport::ConnId conn);               // mu_ held
  int peer_of(transport::ConnId conn);              // mu_ held; -1 when unknown

  int rank_, size_;
  NetOptions opts_;
  transport::MessageTransport net_;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::vector<transport::ConnId> conns_;
  std::map<transport::ConnId, int> rank_of_;
  std::vector<std::optional<Status>> dead_;
  std::optional<Status> closed_;
  std::map<Key, Posted> posted_;
  std::set<Key> registered_;  // data receives posted to net and not yet served
  std::set<Key> claimed_;     // served by on_message before net saw the posting
  std::map<Key, std::deque<transport::Buffer>> early_;
  std::vector<size_t> early_count_;    // per peer
  std::vector<uint64_t> early_bytes_;  // per peer

  // Liveness (under mu_).
  LivenessConfig live_;
  std::vector<std::string> where_;  // per rank: "host:port"
  // The shared detector (transport/liveness.h): the beats, the successor's
  // silence and probe, the verdict and its suspect.
  transport::Liveness detector_;
  std::vector<Completion> held_;  // operations waiting for the verdict
  std::function<void(const Status&)> on_verdict_;
  std::vector<bool> left_;  // per peer: said goodbye (closed in order)
  // Lazy connections (under mu_).
  std::vector<std::pair<std::string, int>> book_;             // set by connect_all
  std::vector<std::deque<Deferred>> deferred_;                // per peer
  std::vector<char> flushing_, dialing_;                      // per peer
  std::vector<std::optional<Clock::time_point>> wait_until_;  // per lower-side wait
  std::vector<Clock::time_point> asked_;  // per lower-side wait: when it last asked
  std::deque<int> dial_queue_;            // peers to dial (higher side) or ask (lower side)
  std::vector<int> early_dial_me_;        // asked to dial before connect_all (bounded by size_)
  std::vector<std::thread> dialers_;
  std::condition_variable lazy_cv_;
  bool lazy_stop_ = false;
  int watched_ = -1;  // the ring successor this rank times (-1: none)
  std::atomic<uint64_t> heartbeats_sent_{0};
  bool live_stop_ = false;
  std::thread live_thread_;
  std::shared_ptr<VerdictPort> port_ = std::make_shared<VerdictPort>();

  std::vector<transport::Fd> streams_;  // per peer; set once by connect_all
  std::vector<std::unique_ptr<transport::TlsLink>>
      stream_tls_;                          // per peer, with TLS; set with streams_
  std::atomic<bool> streams_ready_{false};  // set by connect_all before any operation
  std::mutex stream_mu_;

  // The DirectStreams face of this transport (a member, not a base class:
  // rank(), is_closed() ... would otherwise clash with Transport's).
  class Streams final : public DirectStreams {
   public:
    explicit Streams(TcpTransport& t) : t_(t) {}
    int rank() const override { return t_.rank_; }
    int stream_fd(int peer) const override { return t_.stream_fd(peer); }
    transport::TlsLink* stream_tls(int peer) const override { return t_.stream_tls(peer); }
    std::unique_lock<std::mutex> lock_streams() override { return t_.lock_streams(); }
    bool is_closed() const override { return t_.is_closed(); }
    Status stream_error(int peer, const std::string& why, ErrorCode code) override {
      return t_.stream_error(peer, why, code);
    }
    WorkerThread& writer_thread() override { return writer_; }
    WorkerThread& reader_thread() override { return reader_; }

   private:
    TcpTransport& t_;
    // Declared last in TcpTransport, so joined first when it is destroyed;
    // idle then (every operation waits for its jobs before it returns).
    WorkerThread writer_, reader_;
  };
  Streams streams_api_{*this};
};

}  // namespace pushpull::transport
