// SPDX-License-Identifier: Apache-2.0
// Communicator::Impl: the background engine behind include/pushpull/collective.h.
//
// One thread per communicator owns all communication. User calls enqueue an
// op and return a handle. The thread announces new ops to rank 0 (ids from
// the response cache for repeats), rank 0's Coordinator decides what is ready
// and broadcasts responses, and every rank executes the responses in the same
// order, which numbers the ops identically everywhere (the tags of their
// messages). Control messages travel as (length, body) pairs on reserved tags.
// From kNegotiationTreeFrom ranks they travel over the negotiation tree
// (negotiation_tree.h): announcements up through each rank's parent, which
// aggregates repeats, responses down through each rank's children, which the
// rank forwards before executing them.
//
// Failure: any transport error (a dead peer, a timeout, a malformed message)
// is fatal to the communicator: every pending and later op fails with it, and
// the transport is closed with that reason, so the peers fail too (a cascade
// that reaches every rank through their control channels within one step).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "collective/algorithms.h"
#include "collective/coordinator.h"
#include "collective/hierarchical.h"
#include "collective/messages.h"
#include "collective/negotiation_tree.h"
#include "pushpull/collective.h"
#include "transport/transport.h"

namespace pushpull::collective {

using transport::Transport;

namespace detail {
struct HandleState {
  std::string name;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  Array output;
  int value = -1;       // join: the rank that joined last
  uint64_t flight = 0;  // its flight recorder entry (base/flight_recorder.h)
  void complete(Status st);
};
}  // namespace detail

class Communicator::Impl {
 public:
  Impl(std::unique_ptr<Transport> transport, CommunicatorOptions options);
  ~Impl();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommunicatorOptions& options() const { return opts_; }
  Handle submit(Spec spec, ArrayView input, ArrayView output);
  Handle join();
  void shutdown();
  Status failure() {
    std::lock_guard lock(mu_);
    return failed_;
  }
  static Handle make_handle(std::shared_ptr<detail::HandleState> s) { return Handle(std::move(s)); }

 private:
  struct LocalOp {
    Spec spec;
    ArrayView input, output;
    std::shared_ptr<detail::HandleState> handle;
  };
  struct Event {
    int peer;
    int stage;  // 0: length arrived, 1: body arrived, 2: a control send failed
    Status status;
  };
  struct Inbox {
    uint64_t len = 0;
    std::string body;
  };

  void run();
  void post_length(int peer);
  void on_event(const Event& ev);
  void on_tree_message(int peer, std::string body);
  void send_up();
  void send_control(int peer, std::shared_ptr<const std::string> body);
  void announce(const std::vector<Spec>& specs, bool join);
  void coordinate();
  void execute(std::vector<Response>& rs);
  void execute_one(Response& r);
  void run_allreduce(const Response& r, const std::vector<Spec>& specs, AlgoContext& ctx);
  void run_allgather(const Response& r, const Spec& spec, AlgoContext& ctx);
  void run_reduce_scatter(const Response& r, const Spec& spec, AlgoContext& ctx);
  void finish(const std::string& name, Status st, Array output = {});
  LocalOp* find(const std::string& name);
  void fatal(const Status& st);

  std::unique_ptr<Transport> transport_;
  CommunicatorOptions opts_;
  int rank_, size_;

  std::mutex mu_;  // guards the fields down to `events_`
  std::condition_variable cv_;
  bool stopping_ = false;
  Status failed_;
  std::set<std::string> active_names_;
  std::vector<LocalOp> submitted_;
  std::shared_ptr<detail::HandleState> join_handle_;
  bool join_requested_ = false;
  std::deque<Event> events_;

  // Engine thread only.
  std::unordered_map<std::string, LocalOp> local_;
  std::vector<Inbox> inbox_;
  ResponseCache cache_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0
  // The negotiation tree (tree_): this rank's parent (-1: rank 0), children
  // and, but on rank 0, the aggregator of its subtree's announcements.
  bool tree_ = false;
  int parent_ = -1;
  std::vector<int> children_;
  std::unique_ptr<TreeAggregator> aggregator_;
  uint64_t next_op_id_ = 1;
  std::vector<char> scratch_, fusion_;
  // Set when allreduce goes through the hosts (hierarchical.h); fixed at construction.
  std::optional<Hierarchy> hierarchy_;
  bool dead_ = false;

  std::thread thread_;
};

}  // namespace pushpull::collective
