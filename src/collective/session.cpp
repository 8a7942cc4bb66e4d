// SPDX-License-Identifier: Apache-2.0
// Session (bootstrap + Communicator) and the Horovod-style free functions over
// the one process-default session (see collective.h for why it exists).
#include <functional>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "base/rank_environment.h"
#include "collective/bootstrap.h"
#include "pushpull/collective.h"
#include "pushpull/log.h"

namespace pushpull::collective {

struct Session::Impl {
  BootstrapMode mode = BootstrapMode::kSingle;
  std::unique_ptr<cluster::Node> node;
  std::unique_ptr<Communicator> comm;
  // Cluster mode: the verdict of comm's transport (Bootstrapped::verdict).
  std::function<std::optional<Status>()> verdict;
  std::mutex mu;
  bool shut = false;

  void start(Bootstrapped b, const Options& options);
};

Session::Session(const Options& options) : impl_(std::make_unique<Impl>()) {
  options.validate();
  impl_->start(bootstrap(options), options);
}

Session::Session(const Options& options, Store& store) : impl_(std::make_unique<Impl>()) {
  options.validate();
  impl_->start(bootstrap(options, store), options);
}

void Session::Impl::start(Bootstrapped b, const Options& options) {
  mode = b.mode;
  node = std::move(b.node);
  if (node) verdict = std::move(b.verdict);
  CommunicatorOptions co = CommunicatorOptions::from(options);
  co.collective.local_rank = b.local_rank;
  co.collective.local_size = b.local_size;
  for (const auto& [host, port] : b.book)  // host identity: the advertised address
    co.hosts.push_back(host);
  comm = std::make_unique<Communicator>(std::move(b.transport), std::move(co));
  PP_DEBUG("collective session: rank {} of {} (local {} of {}), bootstrap {}", comm->rank(),
           comm->size(), b.local_rank, b.local_size, bootstrap_mode_name(b.mode));
}

Session::~Session() {
  shutdown();
}

Communicator& Session::communicator() {
  return *impl_->comm;
}
int Session::rank() const {
  return impl_->comm->rank();
}
int Session::size() const {
  return impl_->comm->size();
}
int Session::local_rank() const {
  return impl_->comm->local_rank();
}
int Session::local_size() const {
  return impl_->comm->local_size();
}
std::string_view Session::mode() const {
  return bootstrap_mode_name(impl_->mode);
}

void Session::shutdown() {
  std::lock_guard lock(impl_->mu);
  if (impl_->shut) return;
  impl_->shut = true;
  // A verdict of the collectives (the mesh's detector, a stall shutdown, a
  // rank's own error) means the job failed: tell the scheduler why (it ends
  // the job for every node with that reason) instead of leaving in order,
  // which would wait for nodes that will never leave. (A peer that shut down
  // in order is no verdict.)
  std::optional<Status> verdict = impl_->verdict ? impl_->verdict() : std::nullopt;
  impl_->comm->shutdown();
  if (impl_->node) {
    if (verdict) impl_->node->report_failure(*verdict);
    try {
      impl_->node->shutdown();
    } catch (const std::exception& e) {
      PP_WARN("collective session: leaving the job: {}", e.what());
    }
    // No handler or callback of the node runs after this (teardown order).
    impl_->node->stop_delivery();
  }
}

// ---- the process-default session -----------------------------------------

namespace {

// The one convenience global of the collective layer: set by init(), reset
// by shutdown(). Ops hold a reference while they run, so a concurrent
// shutdown() does not destroy the session under them.
struct Default {
  std::mutex mu;
  std::shared_ptr<Session> session;
};
Default& default_slot() {
  static Default d;
  return d;
}

std::shared_ptr<Session> current(const char* fn) {
  Default& d = default_slot();
  std::lock_guard lock(d.mu);
  if (!d.session)
    throw InvalidArgument(
        fmt::format("pushpull::collective::{}(): collectives are not initialised; call "
                    "pushpull::collective::init() first (or use a collective::Session object)",
                    fn));
  return d.session;
}

}  // namespace

void init(const Options& options) {
  Default& d = default_slot();
  std::lock_guard lock(d.mu);  // concurrent init() calls make one session
  if (d.session) return;
  d.session = std::make_shared<Session>(options);
}

bool is_initialized() {
  Default& d = default_slot();
  std::lock_guard lock(d.mu);
  return d.session != nullptr;
}

Session& default_session() {
  // The caller's reference is valid until shutdown().
  return *current("default_session");
}

int size() {
  return current("size")->size();
}
int rank() {
  return current("rank")->rank();
}
int local_rank() {
  return current("local_rank")->local_rank();
}
int local_size() {
  return current("local_size")->local_size();
}
std::vector<std::pair<std::string, std::string>> rank_environment() {
  auto s = current("rank_environment");
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [name, value] :
       round_variables(s->rank(), s->size(), s->local_rank(), s->local_size()))
    out.emplace_back(name, std::move(value));
  return out;
}

Handle allreduce_async(std::string name, ArrayView input, ArrayView output, Reduction op) {
  return current("allreduce_async")
      ->communicator()
      .allreduce_async(std::move(name), input, output, op);
}
Handle allreduce_async(std::string name, ArrayView inout, Reduction op) {
  return current("allreduce_async")->communicator().allreduce_async(std::move(name), inout, op);
}
void allreduce(std::string name, ArrayView input, ArrayView output, Reduction op) {
  current("allreduce")->communicator().allreduce(std::move(name), input, output, op);
}
void allreduce(std::string name, ArrayView inout, Reduction op) {
  current("allreduce")->communicator().allreduce(std::move(name), inout, op);
}
Handle broadcast_async(std::string name, ArrayView data, int root) {
  return current("broadcast_async")->communicator().broadcast_async(std::move(name), data, root);
}
void broadcast(std::string name, ArrayView data, int root) {
  current("broadcast")->communicator().broadcast(std::move(name), data, root);
}
Handle allgather_async(std::string name, ArrayView input) {
  return current("allgather_async")->communicator().allgather_async(std::move(name), input);
}
Array allgather(std::string name, ArrayView input) {
  return current("allgather")->communicator().allgather(std::move(name), input);
}
Handle reduce_scatter_async(std::string name, ArrayView input, Reduction op) {
  return current("reduce_scatter_async")
      ->communicator()
      .reduce_scatter_async(std::move(name), input, op);
}
Array reduce_scatter(std::string name, ArrayView input, Reduction op) {
  return current("reduce_scatter")->communicator().reduce_scatter(std::move(name), input, op);
}
void barrier() {
  current("barrier")->communicator().barrier();
}
int join() {
  return current("join")->communicator().join();
}
bool poll(const Handle& h) {
  return current("poll")->communicator().poll(h);
}
void wait(const Handle& h, std::optional<Millis> timeout) {
  current("wait")->communicator().wait(h, timeout);
}
Array take_output(const Handle& h, std::optional<Millis> timeout) {
  return current("take_output")->communicator().take_output(h, timeout);
}

void shutdown() {
  std::shared_ptr<Session> s;
  {
    Default& d = default_slot();
    std::lock_guard lock(d.mu);
    s = std::move(d.session);
  }
  if (s) s->shutdown();  // destroyed when the last op holding it returns
}

}  // namespace pushpull::collective
