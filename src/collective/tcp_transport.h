// The collective Transport over TCP (src/net): one net::Transport per rank,
// one connection per pair of ranks (the higher rank connects to the lower).
//
// Zero copy both ways for data: sends writev() straight from the caller's
// buffer; a data receive is posted to net so its payload is read straight
// into the destination. A message that arrives before its receive is posted
// lands in a pooled buffer and is copied when the receive comes (control
// messages, whose tags repeat, always take that path so a stale posting can
// never capture a later message).
//
// Data streams (tcp_streams.h): connect_all also opens one plain TCP
// connection per pair of ranks, authenticated by a nonce exchanged over the
// net connection, which the ring, halving-doubling, broadcast and barrier
// drive directly from their own thread (StreamPump; large rings add a
// StreamWriter thread) for speed. One operation
// uses them at a time (lock_streams()); post_send/post_recv keep going over
// net, so the engine's control traffic never mixes with them.
//
// Failure: a closed connection fails every operation with that rank with
// PeerFailure naming it; close() stops the net transport (its thread joined,
// every pending completion run) before returning.
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
#include <utility>
#include <vector>

#include "collective/transport.h"
#include "net/socket.h"
#include "net/transport.h"

namespace pushpull::collective {

class TcpTransport final : public Transport {
 public:
  // Listens on host:port (0 = a free port) as `rank` of `size`.
  TcpTransport(int rank, int size, const NetOptions& net, const std::string& host = "127.0.0.1",
               int port = 0);
  ~TcpTransport() override;

  int port() const { return net_.port(); }
  // book[r] = (host, port) of rank r. Connects to every lower rank and waits
  // for every higher one, all within net.connect_timeout; throws Timeout
  // naming the missing ranks.
  void connect_all(const std::vector<std::pair<std::string, int>>& book);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void post_send(int peer, uint64_t tag, const void* data, size_t bytes, Completion done) override;
  void post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) override;
  void close(const Status& reason) override;

  // Data streams (see above). stream_fd: -1 when there is none to `peer`.
  bool has_streams() const { return streams_ready_; }
  int stream_fd(int peer) const;
  // Held by an algorithm for the whole of its use of the streams.
  std::unique_lock<std::mutex> lock_streams() { return std::unique_lock(stream_mu_); }
  bool is_closed() const;
  // The error of a failed stream operation with `peer`: the closing reason
  // after close(), else `code` naming the peer and `why`.
  Status stream_error(int peer, const std::string& why,
                      ErrorCode code = ErrorCode::kPeerFailure) const;

 private:
  void setup_streams(const std::vector<std::pair<std::string, int>>& book);
  using Key = std::pair<int, uint64_t>;
  struct Posted {
    void* dst;
    size_t bytes;
    Completion done;
  };
  void on_message(net::Message&& m);
  void on_net_recv(Key key, const Status& st, const net::Header& h);
  void on_close(net::ConnId id, const Status& st);
  Status peer_error(int peer, const Status& why) const;

  int rank_, size_;
  NetOptions opts_;
  net::Transport net_;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::vector<net::ConnId> conns_;
  std::map<net::ConnId, int> rank_of_;
  std::vector<std::optional<Status>> dead_;
  std::optional<Status> closed_;
  std::map<Key, Posted> posted_;
  std::set<Key> registered_;  // data receives posted to net and not yet served
  std::set<Key> claimed_;     // served by on_message before net saw the posting
  std::map<Key, std::deque<net::Buffer>> early_;

  std::string host_;                        // where the stream listener binds
  std::vector<net::Fd> streams_;            // per peer; set once by connect_all
  std::atomic<bool> streams_ready_{false};  // set by connect_all before any operation
  std::mutex stream_mu_;
};

}  // namespace pushpull::collective
