// SPDX-License-Identifier: Apache-2.0
// The parameter server's control plane at scale (scale_sim.h): a scheduler
// (node 0), S servers (real ps::ServerStores) and N workers on the simulated
// network. What is real and what is modeled, and after which code: see
// scale_sim.h.
#include <fmt/format.h>

#include <cstring>
#include <memory>

#include "base/liveness.h"
#include "cluster/barrier_book.h"
#include "cluster/describe.h"
#include "cluster/protocol.h"
#include "ps/protocol.h"
#include "ps/server_store.h"
#include "pushpull/array.h"
#include "sim/scale_net.h"
#include "transport/message.h"

namespace pushpull::sim::scale {
namespace {

constexpr uint64_t kHeader = transport::kHeaderBytes;
constexpr uint8_t kWorkersGroup = static_cast<uint8_t>(cluster::Group::kWorkers);

class PsWorld;

class SimServer final : public ps::ServerResponder {
 public:
  SimServer(PsWorld& w, int rank, int servers, int workers) : w_(w), rank_(rank) {
    ps::ServerStoreConfig c;
    c.num_workers = workers;
    c.sync = true;
    c.threads = 0;  // run by the simulation
    c.server_rank = rank;
    c.num_servers = servers;
    store_ = std::make_unique<ps::ServerStore>(c, *this);
  }
  ~SimServer() override { store_.reset(); }
  void reply(const ps::RequestMeta& to, const Status& st, DType, std::span<const std::byte> data,
             std::shared_ptr<void>) override;
  ps::ServerStore& store() { return *store_; }

 private:
  PsWorld& w_;
  int rank_;
  std::unique_ptr<ps::ServerStore> store_;
};

ps::Payload floats(float value) {
  auto a = std::make_shared<Array>(Array::full(Shape{4}, value));
  return ps::Payload{a->view(), a};
}

class PsWorld {
 public:
  explicit PsWorld(const Config& c)
      : c_(c),
        S_(c.servers),
        N_(c.ranks),
        net_(1 + c.servers + c.ranks, c.costs),
        silence_(net_.clock(), Millis(c.heartbeat_timeout_us / 1000)),
        have_(static_cast<size_t>(nodes()), 0),
        expected_(static_cast<size_t>(nodes()), 0),
        booked_(static_cast<size_t>(nodes()), false),
        is_registered_(static_cast<size_t>(nodes()), false),
        barrier_count_(static_cast<size_t>(N_), 0),
        barrier_done_(static_cast<size_t>(N_)) {
    for (int s = 0; s < S_; ++s)
      servers_.push_back(std::make_unique<SimServer>(*this, s, S_, N_));
    for (int r = 0; r < N_; ++r)
      members_.emplace_back(Role::kWorker, r);
  }
  Report run();
  void reply(int server, const ps::RequestMeta& to, bool ok, std::span<const std::byte> data) {
    net_.send(server_node(server), worker_node(to.worker), kHeader + data.size(),
              [this, w = to.worker, ok, v = std::vector<std::byte>(data.begin(), data.end())] {
                on_reply(w, ok, v);
              });
  }

 private:
  int server_node(int s) const { return 1 + s; }
  int worker_node(int r) const { return 1 + S_ + r; }
  int nodes() const { return 1 + S_ + N_; }
  bool is_worker(int node) const { return node > S_; }
  // Servers on hosts of their own, workers local_size to a host (GPUs of one
  // machine); the port tells a host's nodes apart.
  cluster::NodeAddress address(int node) const {
    const Role role = is_worker(node) ? Role::kWorker : Role::kServer;
    const int rank = is_worker(node) ? node - 1 - S_ : node - 1;
    const int host = is_worker(node) ? S_ + rank / c_.local_size : rank;
    return {role, rank, fmt::format("10.0.{}.{}", host / 250, host % 250 + 1), 40000 + node};
  }
  // Node::start: the scheduler's connection, the registration, heartbeats.
  void start(int node) {
    net_.connect(node, 0, [this, node] {
      auto a = address(node);
      auto reg = cluster::encode_register({a.role, -1, a.host, a.port}, a.rank);
      net_.send(node, 0, kHeader + reg.size(), [this, node, reg] { on_register(node, reg); });
      net_.at(net_.now() + c_.heartbeat_interval_us, [this, node] { beat(node); });
    });
  }
  // Scheduler::on_message(kRegister), then assign_ranks once all are in.
  void on_register(int node, const std::vector<std::byte>& bytes) {
    cluster::NodeAddress a;
    int32_t preferred = -1;
    if (!cluster::decode_register(bytes, &a, &preferred))
      return fail_run(fmt::format("node {}: its registration does not decode", node));
    silence_.heard(node);
    registered_.push_back(node);
    is_registered_[static_cast<size_t>(node)] = true;
    if (static_cast<int>(registered_.size()) == S_ + N_) assign_ranks();
  }
  void assign_ranks() {
    // Every node asked for its launcher rank: the scheduler uses them.
    book_.scheduler = {Role::kScheduler, 0, "10.0.0.1", 9000};
    for (int s = 0; s < S_; ++s)
      book_.servers.push_back(address(server_node(s)));
    for (int r = 0; r < N_; ++r)
      book_.workers.push_back(address(worker_node(r)));
    book_.one_host = cluster::same_host(book_);
    auto shared = std::make_shared<const std::vector<std::byte>>(cluster::encode_book(0, book_));
    for (int node : registered_) {
      // Every node's own book (its rank differs) is encoded, as the
      // scheduler does; the receivers decode one shared copy.
      const size_t bytes = kHeader + cluster::encode_book(address(node).rank, book_).size();
      net_.send(0, node, bytes, [this, node, shared] { on_book(node, *shared); });
    }
  }
  void on_book(int node, const std::vector<std::byte>& bytes) {
    int32_t rank = -1;
    cluster::AddressBook book;
    if (!cluster::decode_book(bytes, &rank, &book) ||
        book.workers.size() != static_cast<size_t>(N_))
      return fail_run(fmt::format("node {}: its address book does not decode", node));
    booked_[static_cast<size_t>(node)] = true;
    std::vector<int> targets;
    auto& want = expected_[static_cast<size_t>(node)];
    if (is_worker(node)) {
      const int rank_of = node - 1 - S_;
      for (int s = 0; s < S_; ++s)
        targets.push_back(server_node(s));
      if (c_.worker_mesh)
        for (int w = 0; w < rank_of; ++w)
          targets.push_back(worker_node(w));
      want = S_ + (c_.worker_mesh ? N_ - 1 : 0);
    } else {
      want = N_;
      if (cluster::ps_replicas(-1, S_) > 0) {
        want += S_ - 1;
        for (int s = 0; s < node - 1; ++s)
          targets.push_back(server_node(s));
      }
    }
    // Every dial at once (Node::start since the parallel dialing).
    for (int t : targets)
      net_.connect(
          node, t, [this, node] { peer_up(node); }, [this, t] { peer_up(t); });
    peer_up(node, 0);
  }
  void peer_up(int node, int n = 1) {
    auto& have = have_[static_cast<size_t>(node)];
    have += n;
    if (booked_[static_cast<size_t>(node)] && have == expected_[static_cast<size_t>(node)] &&
        is_worker(node))
      node_started(node - 1 - S_);
  }
  // DistStore's constructor: rank 0 sets the servers' mode, then a barrier.
  void node_started(int rank) {
    if (rank != 0) return barrier(rank, [this, rank] { store_ready(rank); });
    const size_t bytes = kHeader + ps::encode_mode(ps::Mode{}).size();
    auto left = std::make_shared<int>(S_);
    for (int s = 0; s < S_; ++s)
      net_.send(worker_node(0), server_node(s), bytes, [this, s, left] {
        net_.send(server_node(s), worker_node(0), kHeader, [this, left] {
          if (--*left == 0) barrier(0, [this] { store_ready(0); });
        });
      });
  }
  // Node::barrier and the scheduler's real BarrierBook.
  void barrier(int rank, std::function<void()> done) {
    const uint64_t count = ++barrier_count_[static_cast<size_t>(rank)];
    barrier_done_[static_cast<size_t>(rank)] = std::move(done);
    const int node = worker_node(rank);
    net_.send(node, 0, kHeader, [this, rank, node, count] {
      silence_.heard(node);
      for (const auto& a :
           barriers_.arrive(kWorkersGroup, {Role::kWorker, rank},
                            static_cast<transport::ConnId>(node), count, {}, members_)) {
        const int to = static_cast<int>(a.conn);
        net_.send(0, to, kHeader, [this, to] {
          auto fn = std::move(barrier_done_[static_cast<size_t>(to - 1 - S_)]);
          if (fn) fn();
        });
      }
    });
  }
  // The probe: rank 0 inits the key, a barrier, then every worker's pushpull.
  void store_ready(int rank) {
    if (++ready_ == N_) {
      startup_done_ = net_.now();
      startup_counts_ = net_.counts();
    }
    if (rank != 0) return barrier(rank, [this, rank] { push(rank); });
    float zero[4] = {0, 0, 0, 0};
    auto init =
        ps::encode_init("0", std::span(reinterpret_cast<const std::byte*>(zero), sizeof zero), 0);
    net_.send(worker_node(0), server_node(0), kHeader + init.size(), [this] {
      auto& store = servers_[0]->store();
      store.init({0, 1, 0, false}, {0, 0}, "0", floats(0), 0);
      store.run_queued();
    });
  }
  void push(int rank) {
    net_.send(worker_node(rank), server_node(0), kHeader + 4 * sizeof(float), [this, rank] {
      auto& store = servers_[0]->store();
      store.push({rank, 2, 0, true}, {0, 0}, floats(1.0f + static_cast<float>(rank)), false, 1);
      store.run_queued();
    });
  }
  void on_reply(int rank, bool ok, const std::vector<std::byte>& data) {
    if (!ok) return fail_run(fmt::format("worker {}: the server answered an error", rank));
    if (data.empty()) return barrier(0, [this] { push(0); });  // rank 0's init acknowledged
    // 1 + 2 + ... + N, exact in float32 up to N = 5792.
    const float want = static_cast<float>(N_) * static_cast<float>(N_ + 1) / 2;
    float got[4];
    if (data.size() != sizeof got) return fail_run("a pull of the wrong size");
    std::memcpy(got, data.data(), sizeof got);
    for (float g : got)
      if (g != want) return fail_run(fmt::format("worker {} pulled {}, want {}", rank, g, want));
    if (++pulled_ == N_) round_end_ = net_.now();
  }
  // Node::heartbeat_loop: one heartbeat to the scheduler per interval.
  void beat(int node) {
    if (failed_ || net_.down(node)) return;
    net_.send(node, 0, kHeader, [this, node] {
      // Scheduler::on_message: registered nodes only.
      if (!failed_ && is_registered_[static_cast<size_t>(node)]) silence_.heard(node);
    });
    net_.at(net_.now() + c_.heartbeat_interval_us, [this, node] { beat(node); });
  }
  // Scheduler::run: wakes for the next heartbeat or the next silence
  // deadline, checks the timers (check_timers), broadcasts heartbeats.
  void scheduler_loop() {
    if (failed_) return;
    if (auto expired = silence_.first_expired()) {
      return lose(static_cast<int>(expired->first),
                  fmt::format("no heartbeat for {} ms (limit {} ms); it is stopped, hung or "
                              "unreachable",
                              expired->second.count(), c_.heartbeat_timeout_us / 1000));
    }
    if (net_.now() >= next_beat_) {
      next_beat_ = net_.now() + c_.heartbeat_interval_us;
      for (int node : registered_)
        net_.send(0, node, kHeader, [] {});
    }
    using namespace std::chrono;
    const auto until_silent =
        duration_cast<microseconds>(silence_.next_deadline() - net_.clock().now());
    const int64_t wait = std::clamp<int64_t>(
        std::min<int64_t>(until_silent.count(), static_cast<int64_t>(next_beat_ - net_.now())),
        1000, static_cast<int64_t>(c_.heartbeat_interval_us));
    net_.at(net_.now() + static_cast<uint64_t>(wait), [this] { scheduler_loop(); });
  }
  // Scheduler::lose for a worker without restarts: the job fails, every
  // other node is told (kPeerDead).
  void lose(int node, const std::string& why) {
    failed_ = true;
    const auto who = address(node);
    report_.verdict = fmt::format("{} failed: {}", cluster::describe_node(who), why);
    report_.detect_first_s = static_cast<double>(net_.now() - fault_at_) / 1e6;
    const size_t bytes = kHeader + cluster::encode_dead(who, why).size();
    for (int n : registered_)
      if (n != node)
        net_.send(0, n, bytes, [this] {
          if (++told_ == S_ + N_ - 1)
            report_.detect_all_s = static_cast<double>(net_.now() - fault_at_) / 1e6;
        });
  }
  void fail_run(std::string why) {
    if (report_.failure.empty()) report_.failure = std::move(why);
  }

  Config c_;
  int S_, N_;
  Net net_;
  SilenceDetector<int> silence_;  // the scheduler's, keyed by node
  std::vector<int> registered_;
  cluster::AddressBook book_;
  cluster::BarrierBook barriers_;
  std::vector<cluster::BarrierBook::Member> members_;
  std::vector<int> have_, expected_;
  std::vector<bool> booked_, is_registered_;
  std::vector<Count> startup_counts_;  // at the moment the last store was ready
  std::vector<uint64_t> barrier_count_;
  std::vector<std::function<void()>> barrier_done_;
  std::vector<std::unique_ptr<SimServer>> servers_;
  int ready_ = 0, pulled_ = 0, told_ = 0;
  uint64_t startup_done_ = 0, round_end_ = 0, next_beat_ = 0, fault_at_ = 0;
  bool failed_ = false;
  Report report_;
  friend class SimServer;
};

void SimServer::reply(const ps::RequestMeta& to, const Status& st, DType,
                      std::span<const std::byte> data, std::shared_ptr<void>) {
  w_.reply(rank_, to, st.is_ok(), data);
}

Report PsWorld::run() {
  report_.engine = c_.worker_mesh ? "ps (worker mesh)" : "ps";
  report_.ranks = N_;
  for (int node = 1; node < nodes(); ++node)
    start(node);
  net_.at(0, [this] { scheduler_loop(); });
  const uint64_t limit = kStartupLimitUs;
  while (pulled_ < N_ && report_.failure.empty() && net_.now() < limit)
    if (!net_.run(net_.now() + 100'000)) break;
  if (pulled_ < N_) {
    fail_run(fmt::format("the pushpull did not complete ({} of {} workers)", pulled_, N_));
    return report_;
  }
  // Start-up: everything until the last store was ready.
  const std::vector<Count> zero(net_.counts().size());
  const auto& after_round = startup_counts_;
  const int first = worker_node(0), last = nodes();
  report_.connections = spread(
      zero, after_round, [](const Count& c) { return c.connections; }, first, last, 0);
  report_.startup_messages = spread(
      zero, after_round, [](const Count& c) { return c.messages; }, first, last, 0);
  report_.startup_bytes = spread(
      zero, after_round, [](const Count& c) { return c.bytes; }, first, last, 0);
  report_.startup_s = static_cast<double>(startup_done_) / 1e6;
  report_.round_ms = static_cast<double>(round_end_ - startup_done_) / 1e3;
  report_.values_ok = true;
  // Steady state: three heartbeat intervals.
  const uint64_t iv = c_.heartbeat_interval_us, t1 = net_.now() + iv;
  net_.run(t1);
  const auto before = net_.counts();
  net_.run(t1 + 3 * iv);
  const auto& now = net_.counts();
  report_.heartbeat_messages = spread(
      before, now, [](const Count& c) { return c.messages; }, first, last, 0, 3);
  report_.heartbeat_bytes = spread(
      before, now, [](const Count& c) { return c.bytes; }, first, last, 0, 3);
  report_.heartbeat_cpu = spread(
      before, now, [](const Count& c) { return c.busy_us; }, first, last, 0, 3.0 * iv);
  // The fault, a third of an interval after a heartbeat round.
  fault_at_ = net_.now() + iv / 3;
  const int victim = worker_node(c_.victim >= 0 ? c_.victim : N_ - 1);
  net_.at(fault_at_, [this, victim] {
    net_.stop(victim);
    if (c_.fault == Fault::kKill)  // Scheduler::on_close: the kernel closed it
      net_.at(net_.now() + c_.costs.latency_us, [this, victim] {
        if (!failed_)
          lose(victim,
               "its connection closed (connection closed by the peer); it crashed, was killed or "
               "lost the network");
      });
  });
  const uint64_t end = fault_at_ + c_.heartbeat_timeout_us + 30'000'000;
  while (told_ < S_ + N_ - 1 && net_.now() < end)
    if (!net_.run(net_.now() + 100'000)) break;
  if (!failed_) fail_run("the fault was never detected");
  report_.events = net_.events();
  return report_;
}

}  // namespace

Report run_ps(const Config& c) {
  PsWorld w(c);
  return w.run();
}

}  // namespace pushpull::sim::scale
