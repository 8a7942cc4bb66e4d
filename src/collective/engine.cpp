// SPDX-License-Identifier: Apache-2.0
// The engine thread: control traffic, negotiation, failure handling. The
// execution of agreed responses is in execute.cpp.
#include "collective/engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/flight_recorder.h"
#include "base/metrics.h"
#include "base/timeline.h"
#include "pushpull/log.h"

namespace pushpull::collective {

using transport::Clock;
using transport::kControlTagBit;
using transport::Transport;

namespace {

constexpr uint64_t kLengthTag = kControlTagBit | 1;
constexpr uint64_t kBodyTag = kControlTagBit | 2;
constexpr uint64_t kMaxControlBytes = uint64_t{1} << 30;

}  // namespace

void detail::HandleState::complete(Status st) {
  {
    std::lock_guard lock(mu);
    if (done) return;
    flight::update(flight, st.is_ok() ? flight::State::kDone : flight::State::kFailed);
    status = std::move(st);
    done = true;
  }
  cv.notify_all();
}

Communicator::Impl::Impl(std::unique_ptr<Transport> transport, CommunicatorOptions options)
    : transport_(std::move(transport)),
      opts_(std::move(options)),
      rank_(transport_->rank()),
      size_(transport_->size()),
      inbox_(static_cast<size_t>(size_)) {
  if (rank_ == 0) coordinator_ = std::make_unique<Coordinator>(size_, opts_.collective, cache_);
  tree_ = size_ >= kNegotiationTreeFrom;
  if (tree_) {
    parent_ = tree_parent(rank_);
    children_ = tree_children(rank_, size_);
    if (rank_ != 0)
      aggregator_ = std::make_unique<TreeAggregator>(rank_, size_, opts_.collective, cache_);
  }
  metrics::start_from_env();  // PUSHPULL_METRICS_PORT: the endpoint answers from now on
  flight::start_from_env();   // the ring and its SIGUSR1 dump
  std::string note;
  const int mode = opts_.collective.hierarchical_allreduce;
  hierarchy_ = choose_hierarchy(opts_.hosts, rank_, mode, &note);
  if (rank_ == 0 && (hierarchy_ || mode > 0) && !note.empty()) {
    if (hierarchy_)
      PP_INFO("collective: hierarchical allreduce: {}", note);
    else
      PP_WARN("collective: hierarchical allreduce {}", note);
  }
  thread_ = std::thread([this] { run(); });
}

Communicator::Impl::~Impl() {
  shutdown();
}

Handle Communicator::Impl::submit(Spec spec, ArrayView input, ArrayView output) {
  auto h = std::make_shared<detail::HandleState>();
  h->name = spec.name;
  {
    std::lock_guard lock(mu_);
    if (!failed_.is_ok()) {
      h->complete(failed_);
      return make_handle(h);
    }
    if (stopping_)
      throw InvalidArgument(fmt::format("collective: '{}' submitted after shutdown()", spec.name));
    if (!active_names_.insert(spec.name).second)
      throw InvalidArgument(fmt::format(
          "collective: an op named '{}' is still pending on rank {}; wait for it before reusing "
          "the name",
          spec.name, rank_));
    h->flight = flight::record(op_type_name(spec.type), spec.name,
                               static_cast<int64_t>(spec.bytes()), flight::State::kQueued);
    submitted_.push_back(LocalOp{std::move(spec), input, output, h});
    PP_TIMELINE_PHASE(fmt::format("rank {}", rank_), h->name, "QUEUE");  // timeline hook
  }
  cv_.notify_all();
  return make_handle(h);
}

Handle Communicator::Impl::join() {
  auto h = std::make_shared<detail::HandleState>();
  h->name = "join";
  {
    std::lock_guard lock(mu_);
    if (!failed_.is_ok()) {
      h->complete(failed_);
      return make_handle(h);
    }
    if (stopping_) throw InvalidArgument("collective: join() after shutdown()");
    if (join_handle_)
      throw InvalidArgument(fmt::format("collective: rank {} has already joined", rank_));
    join_handle_ = h;
    join_requested_ = true;
  }
  cv_.notify_all();
  return make_handle(h);
}

void Communicator::Impl::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  // Closing first cuts short any wait the engine thread is in.
  Status reason(ErrorCode::kPeerFailure,
                fmt::format("collective: rank {} shut down its communicator", rank_));
  transport_->close(reason);
  if (thread_.joinable()) thread_.join();
  std::vector<std::shared_ptr<detail::HandleState>> left;
  {
    std::lock_guard lock(mu_);
    for (auto& op : submitted_)
      left.push_back(op.handle);
    submitted_.clear();
    if (join_handle_) left.push_back(join_handle_);
    join_handle_.reset();
    active_names_.clear();
  }
  for (auto& [name, op] : local_)
    left.push_back(op.handle);
  local_.clear();
  for (auto& h : left)
    h->complete(reason);
}

void Communicator::Impl::post_length(int peer) {
  Inbox& in = inbox_[static_cast<size_t>(peer)];
  transport_->post_recv(peer, kLengthTag, &in.len, sizeof in.len, [this, peer](const Status& st) {
    {
      std::lock_guard lock(mu_);
      events_.push_back(Event{peer, 0, st});
    }
    cv_.notify_all();
  });
}

void Communicator::Impl::send_control(int peer, std::shared_ptr<const std::string> body) {
  auto len = std::make_shared<uint64_t>(body->size());
  auto report = [this, peer](const Status& st) {
    if (st.is_ok()) return;
    {
      std::lock_guard lock(mu_);
      events_.push_back(Event{peer, 2, st});
    }
    cv_.notify_all();
  };
  transport_->post_send(peer, kLengthTag, len.get(), sizeof *len,
                        [len, report](const Status& st) { report(st); });
  transport_->post_send(peer, kBodyTag, body->data(), body->size(),
                        [body, report](const Status& st) { report(st); });
}

void Communicator::Impl::on_event(const Event& ev) {
  if (!ev.status.is_ok()) ev.status.raise();
  Inbox& in = inbox_[static_cast<size_t>(ev.peer)];
  if (ev.stage == 0) {
    if (in.len > kMaxControlBytes)
      throw ProtocolError(
          fmt::format("collective: control message of {} bytes from rank {}", in.len, ev.peer));
    in.body.resize(in.len);
    transport_->post_recv(ev.peer, kBodyTag, in.body.data(), in.body.size(),
                          [this, peer = ev.peer](const Status& st) {
                            {
                              std::lock_guard lock(mu_);
                              events_.push_back(Event{peer, 1, st});
                            }
                            cv_.notify_all();
                          });
    return;
  }
  std::string body = std::move(in.body);
  in.body.clear();
  if (tree_) return on_tree_message(ev.peer, std::move(body));
  if (rank_ == 0) {
    Announce a = decode_announce(body, size_);
    auto now = Clock::now();
    for (auto& s : a.specs)
      coordinator_->submit(ev.peer, std::move(s), now);
    for (uint32_t id : a.cached)
      coordinator_->submit_cached(ev.peer, id, now);
    if (a.join) coordinator_->join(ev.peer, now);
    post_length(ev.peer);
  } else {
    auto rs = decode_responses(body, size_);
    post_length(ev.peer);
    execute(rs);
  }
}

void Communicator::Impl::on_tree_message(int peer, std::string body) {
  auto now = Clock::now();
  if (peer == parent_) {
    auto rs = decode_responses(body, size_);
    // Forwarded before executing: the children take part in what this rank
    // is about to run. The same bytes, not re-encoded.
    auto shared = std::make_shared<const std::string>(std::move(body));
    for (int c : children_)
      send_control(c, shared);
    aggregator_->passed_down(rs);
    post_length(peer);
    execute(rs);
    return;
  }
  Upward up = decode_upward(body, size_);
  if (rank_ == 0)
    deliver(*coordinator_, cache_, peer, size_, up, now);
  else
    aggregator_->receive(peer, up, now);
  post_length(peer);
}

void Communicator::Impl::send_up() {
  Upward up = aggregator_->take(Clock::now());
  if (up.empty()) return;
  send_control(parent_, std::make_shared<const std::string>(encode(up)));
}

void Communicator::Impl::announce(const std::vector<Spec>& specs, bool join) {
  auto now = Clock::now();
  Announce a;
  if (aggregator_) {
    for (const auto& spec : specs)
      aggregator_->submit(spec, now);
    if (join) aggregator_->join(now);
    return;  // sent by send_up()
  }
  for (const auto& spec : specs) {
    if (rank_ == 0) {
      coordinator_->submit(0, spec, now);
    } else {
      uint32_t id = cache_.find(spec);
      if (id != kNoCacheId)
        a.cached.push_back(id);
      else
        a.specs.push_back(spec);
    }
  }
  if (rank_ == 0) {
    if (join) coordinator_->join(0, now);
    return;
  }
  a.join = join;
  if (a.specs.empty() && a.cached.empty() && !a.join) return;
  send_control(0, std::make_shared<const std::string>(encode(a)));
}

void Communicator::Impl::coordinate() {
  std::vector<StallReport> stalls;
  auto rs = coordinator_->poll(Clock::now(), &stalls);
  for (const auto& s : stalls) {
    PP_WARN(
        "collective: tensor '{}' has waited {:.1f} s for ranks [{}], which have not submitted "
        "it; a rank may be stuck or running a different sequence of collectives",
        s.tensor, s.waited_seconds, fmt::join(s.missing_ranks, ", "));
    PP_METRIC_ADD(kCollectiveStalls, 1);  // metrics hook
    flight::dump(fmt::format("stall: tensor '{}' has waited {:.1f} s for ranks [{}]", s.tensor,
                             s.waited_seconds, fmt::join(s.missing_ranks, ", ")));
    if (opts_.on_stall) opts_.on_stall(s);
  }
  if (rs.empty()) return;
  auto body = std::make_shared<const std::string>(encode(rs));
  if (tree_) {
    for (int c : children_)
      send_control(c, body);
  } else {
    for (int p = 1; p < size_; ++p)
      send_control(p, body);
  }
  execute(rs);
}

void Communicator::Impl::fatal(const Status& st) {
  std::vector<std::shared_ptr<detail::HandleState>> fail;
  bool stopping = false;
  {
    std::lock_guard lock(mu_);
    if (!failed_.is_ok()) return;
    failed_ = st;
    stopping = stopping_;
    for (auto& op : submitted_)
      fail.push_back(op.handle);
    submitted_.clear();
    if (join_handle_) fail.push_back(join_handle_);
    join_handle_.reset();
    active_names_.clear();
    if (!stopping_ && (!local_.empty() || !fail.empty()))
      PP_ERROR("collective: rank {} fails its pending operations: {}", rank_, st.message());
  }
  for (auto& [name, op] : local_)
    fail.push_back(op.handle);
  local_.clear();
  // Nothing in flight: a peer ended (or died) while this rank was idle, as
  // ranks that finish a job close at slightly different moments. No
  // operation of this rank hangs or fails, so there is nothing to dump.
  const bool pending = !fail.empty();
  dead_ = true;
  // Close before completing the handles: closing withdraws every pending
  // send and receive of this rank (an aborted algorithm leaves some), so no
  // peer touches the callers' buffers once they see their handles fail.
  // abort() tells the peers why first (a transport that can), so they blame
  // the node that failed, then closes.
  transport_->abort(st);
  for (auto& h : fail)
    h->complete(st);
  if (!stopping && pending) flight::dump(fmt::format("failure: {}", st.message()));
}

void Communicator::Impl::run() {
  ScopedLogContext log_context(fmt::format("collective rank {}", rank_));
  if (tree_) {
    if (parent_ >= 0) post_length(parent_);
    for (int c : children_)
      post_length(c);
  } else if (size_ > 1) {
    if (rank_ == 0)
      for (int p = 1; p < size_; ++p)
        post_length(p);
    else
      post_length(0);
  }
  std::unique_lock lock(mu_);
  while (!stopping_) {
    auto now = Clock::now();
    auto wake = now + std::chrono::hours(1);
    if (coordinator_ && !dead_) wake = coordinator_->next_deadline(now);
    if (aggregator_ && !dead_) wake = std::min(wake, aggregator_->next_deadline(now));
    cv_.wait_until(lock, wake, [&] {
      return stopping_ || (!dead_ && (!submitted_.empty() || join_requested_ || !events_.empty()));
    });
    if (stopping_) break;
    if (dead_) {
      events_.clear();
      continue;
    }
    std::vector<LocalOp> subs = std::move(submitted_);
    submitted_.clear();
    bool join = join_requested_;
    join_requested_ = false;
    std::deque<Event> evs = std::move(events_);
    events_.clear();
    lock.unlock();
    // Registered before anything can throw, so fatal() fails their handles.
    std::vector<Spec> specs;
    for (auto& op : subs) {
      PP_TIMELINE_PHASE(fmt::format("rank {}", rank_), op.spec.name, "NEGOTIATE");  // timeline hook
      specs.push_back(op.spec);
      std::string name = op.spec.name;
      local_.emplace(std::move(name), std::move(op));
    }
    try {
      for (const auto& ev : evs)
        on_event(ev);
      if (!specs.empty() || join) announce(specs, join);
      if (coordinator_) coordinate();
      if (aggregator_) send_up();
    } catch (const Error& e) {
      fatal(Status(e.code(), e.what()));
    } catch (const std::exception& e) {
      fatal(Status(ErrorCode::kInternal, fmt::format("collective: rank {}: {}", rank_, e.what())));
    }
    lock.lock();
  }
}

}  // namespace pushpull::collective
