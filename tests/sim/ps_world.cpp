// SPDX-License-Identifier: Apache-2.0
// The simulated parameter-server job (ps_world.h): the scenarios of the
// seeds, events on a simulated clock, a network of per-link FIFO connections,
// the scheduler and the faults (the worker and server models: the other
// ps_world_*.cpp files).
#include <fmt/format.h>

#include "sim/ps_world_impl.h"

namespace pushpull::sim {

std::string Fault::describe() const {
  if (kind == kPartition)
    return fmt::format("cut server {} from {} at {} us for {} us", server,
                       peer_role == kScheduler
                           ? std::string("the scheduler")
                           : fmt::format("{} {}", peer_role == kServer ? "server" : "worker", peer),
                       at_us, continue_after_us);
  if (kind == kKillWorker)
    return fmt::format("kill worker {} at {} us, its replacement starts {} us later", server, at_us,
                       continue_after_us);
  if (kind == kKill && continue_after_us > 0)
    return fmt::format("kill server {} at {} us, restarted {} us after its fail-over", server,
                       at_us, continue_after_us);
  if (kind == kKill) return fmt::format("kill server {} at {} us", server, at_us);
  if (continue_after_us == 0) return fmt::format("stop server {} at {} us for good", server, at_us);
  return fmt::format("stop server {} at {} us, continue {} us later", server, at_us,
                     continue_after_us);
}

std::string Scenario::describe() const {
  std::string out = fmt::format(
      "seed {}: {} servers, {} workers, PUSHPULL_PS_REPLICAS={}, {}, {} rounds, barrier every {}",
      seed, servers, workers, replicas, sync ? "dist_sync" : "dist_async", rounds, barrier_every);
  for (const Fault& f : faults)
    out += "\n  " + f.describe();
  return out;
}

Scenario scenario_for_seed(uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 1);
  auto pick = [&](uint64_t n) { return rng() % n; };
  Scenario s;
  s.seed = seed;
  s.servers = 3 + static_cast<int>(pick(2));  // 3 or 4
  s.workers = 2 + static_cast<int>(pick(2));
  s.replicas = static_cast<int>(pick(static_cast<uint64_t>(s.servers)));  // 0 .. S-1
  s.sync = pick(4) != 0;
  s.rounds = 8 + static_cast<int>(pick(8));
  if (s.sync && pick(2) == 0) s.barrier_every = 1 + static_cast<int>(pick(4));
  const int faults = static_cast<int>(pick(3)) + (s.replicas > 0 ? 1 : 0);
  for (int i = 0; i < faults; ++i) {
    Fault f;
    if (pick(5) == 0) {
      f.kind = Fault::kPartition;
      f.server = static_cast<int>(pick(static_cast<uint64_t>(s.servers)));
      f.at_us = pick(40'000);
      f.peer_role = static_cast<Fault::PeerRole>(pick(3));
      if (f.peer_role == Fault::kServer) {
        f.peer = static_cast<int>(pick(static_cast<uint64_t>(s.servers)));
        if (f.peer == f.server) f.peer = (f.peer + 1) % s.servers;
      } else if (f.peer_role == Fault::kWorker) {
        f.peer = static_cast<int>(pick(static_cast<uint64_t>(s.workers)));
      }
      // Data links: shorter than the heartbeat timeout (longer, the nodes
      // fail the job naming the link: a clean end, not simulated); the
      // scheduler's: any length.
      f.continue_after_us =
          f.peer_role == Fault::kScheduler ? 100'000 + pick(3'000'000) : 1'000 + pick(1'800'000);
      s.faults.push_back(f);
      continue;
    }
    if (pick(3) == 0) {
      f.kind = Fault::kKillWorker;
      f.server = static_cast<int>(pick(static_cast<uint64_t>(s.workers)));
      f.at_us = pick(40'000);
      f.continue_after_us = 100 + pick(20'000);
      s.faults.push_back(f);
      continue;
    }
    f.server = static_cast<int>(pick(static_cast<uint64_t>(s.servers)));
    // Rounds take a few ms of simulated time; faults land anywhere in the job,
    // often close together (a second failure during the first's recovery).
    f.at_us = pick(3) == 0 ? pick(2'000) : pick(40'000);
    if (i > 0 && pick(2) == 0) f.at_us = s.faults.back().at_us + pick(3'000);
    if (pick(3) == 0) {
      f.kind = Fault::kStop;
      const uint64_t mode = pick(3);  // shorter than the heartbeat timeout, longer, never
      f.continue_after_us = mode == 0   ? 1 + pick(1'500'000)
                            : mode == 1 ? 2'100'000 + pick(1'000'000)
                                        : 0;
    }
    // A killed server is restarted (--max-restarts) half the time: it
    // catches up and rejoins, last in its chains.
    if (f.kind == Fault::kKill && pick(2) == 0) f.continue_after_us = 100 + pick(20'000);
    s.faults.push_back(f);
  }
  return s;
}

namespace detail {

// ---- the world -------------------------------------------------------------

World::World(const Scenario& s) : s_(s), rng_(s.seed) {
  dead_.assign(s.servers, false);
  restart_after_.assign(s.servers, 0);
  stopped_.assign(s.servers, false);
  inbox_.resize(s.servers);
  stop_token_.assign(s.servers, 0);
  placement_.dead.assign(s.servers, false);
  placement_.late.assign(s.servers, 0);
  placement_.restarting.assign(s.servers, false);
  // Parts: three whole keys at homes 0, 1, 2 and a key split over two servers.
  parts_ = {{{1, 0}, 4, 0, "a"},
            {{2, 0}, 3, 1 % s.servers, "b"},
            {{3, 0}, 3, 2 % s.servers, "c.0"},
            {{3, 3}, 3, 3 % s.servers, "c.1"}};
  for (size_t p = 0; p < parts_.size(); ++p) {
    std::vector<float> v(static_cast<size_t>(parts_[p].count));
    for (size_t e = 0; e < v.size(); ++e)
      v[e] = static_cast<float>(1 + e + 10 * p);  // distinct per element and part
    initial_.push_back(v);
  }
  spec_ = s.sync ? "sgd:learning_rate=0.5,momentum=0.5" : "test:rescale_grad=0.5";
  if (s.sync) {
    auto opt = create_optimizer(OptimizerSpec::parse(spec_));
    std::vector<std::vector<float>> w = initial_;
    expected_.push_back(w);
    const float sum = static_cast<float>(s.workers * (s.workers + 1) / 2);
    for (int k = 1; k <= s.rounds; ++k) {
      for (size_t p = 0; p < parts_.size(); ++p) {
        std::vector<float> g(w[p].size(), sum);
        ArrayView wv(w[p].data(), DType::kFloat32, Shape{static_cast<int64_t>(w[p].size())});
        ArrayView gv(g.data(), DType::kFloat32, Shape{static_cast<int64_t>(g.size())});
        opt->update(Key(static_cast<int64_t>(p)), wv, gv);
      }
      expected_.push_back(w);
    }
  }
  for (int r = 0; r < s.servers; ++r)
    servers_.push_back(std::make_unique<Server>(*this, r));
  workers_.resize(static_cast<size_t>(s.workers));
  for (int r = 0; r < s.workers; ++r) {
    workers_[r].rank = r;
    workers_[r].view = placement_;
  }
}

bool World::send(int from, int to, Msg m) {
  Link& l = links_[{from, to}];
  if (l.closed) return false;  // that connection is gone: the send fails
  uint64_t delay = 20 + rng_() % 1'000;
  if (rng_() % 40 == 0) delay += rng_() % 30'000;   // a burst on this link
  uint64_t t = std::max(now_ + delay, l.last + 1);  // per-link FIFO (TCP)
  if (auto cut = cut_until_.find({from, to}); cut != cut_until_.end() && cut->second > now_)
    t = std::max(t, cut->second + delay);  // retransmitted once the link is back
  l.last = t;
  const uint64_t gen = l.gen;
  at(t, [this, from, to, gen, m = std::move(m)] { deliver(from, to, gen, m); });
  return true;
}

void World::close(int a, int b) {
  for (auto key : {std::make_pair(a, b), std::make_pair(b, a)}) {
    Link& l = links_[key];
    l.closed = true;
    ++l.gen;  // what is in flight is lost with it
  }
}

void World::close_dead(int node) {
  for (int n = 0; n <= s_.servers + s_.workers; ++n) {
    if (n == node) continue;
    Link& in = links_[{n, node}];
    in.closed = true;
    ++in.gen;
    links_[{node, n}].closed = true;
  }
}

void World::deliver(int from, int to, uint64_t gen, const Msg& m) {
  if (links_[{from, to}].gen != gen || job_failed_) return;
  if (is_worker(to) && workers_[static_cast<size_t>(to - 1 - s_.servers)].dead) return;
  if (to >= 1 && to <= s_.servers) {
    const int r = to - 1;
    if (dead_[r]) return;
    if (stopped_[r]) {
      inbox_[r].emplace_back(from, gen, m);  // in its socket buffer
      return;
    }
  }
  handle(to, from, m);
}

void World::handle(int node, int from, const Msg& m) {
  ++out_.events;
  if (trace_)
    fmt::print("{:>8} {} -> {}: type {} rid {} part {} seq {} epoch {} values {} bytes {}\n", now_,
               from, node, static_cast<int>(m.type), m.request_id, m.part, m.seq,
               m.type == Msg::kPlacement ? m.placement.epoch : m.epoch, fmt::join(m.values, ","),
               m.bytes.size());
  if (node == kScheduler) return on_scheduler(from, m);
  if (node >= 1 && node <= s_.servers) return servers_[node - 1]->handle(from, m);
  Worker& w = workers_[static_cast<size_t>(node - 1 - s_.servers)];
  if (w.dead) return;
  if (m.type == Msg::kBarrierDone) {
    w.in_barrier = false;
    return start_round(w);
  }
  if (m.type == Msg::kPlacement) return on_placement(w, m.placement);
  on_reply(w, m);
}

void World::kill(int server) {
  if (dead_[server]) return;
  dead_[server] = true;
  inbox_[server].clear();
  close_dead(server_node(server));
  // The scheduler sees its connection close at once.
  at(now_ + 500, [this, server] { lose(server, "its connection closed"); });
}

void World::inject(const Fault& f) {
  if (f.kind == Fault::kKillWorker) {
    // (After the job's start: a worker 0 that dies before its init is out
    // of this model.)
    if (!inited_) return at(now_ + 5'000, [this, f] { inject(f); });
    return kill_worker(f.server, f.continue_after_us);
  }
  if (f.kind == Fault::kKill) {
    if (f.continue_after_us > 0 && !dead_[f.server])
      restart_after_[f.server] = f.continue_after_us;  // --max-restarts
    return kill(f.server);
  }
  if (f.kind == Fault::kPartition) {
    const int a = server_node(f.server);
    const int b = f.peer_role == Fault::kScheduler ? kScheduler
                  : f.peer_role == Fault::kServer  ? server_node(f.peer)
                                                   : worker_node(f.peer);
    const uint64_t until = now_ + f.continue_after_us;
    cut_until_[{a, b}] = std::max(cut_until_[{a, b}], until);
    cut_until_[{b, a}] = std::max(cut_until_[{b, a}], until);
    if (b == kScheduler && f.continue_after_us >= kHeartbeatTimeoutUs)
      // No heartbeat either way: the scheduler fails it over, and the server,
      // which does not hear the scheduler, exits.
      at(now_ + kHeartbeatTimeoutUs, [this, f] { kill(f.server); });
    return;
  }
  if (dead_[f.server] || stopped_[f.server]) return;
  stopped_[f.server] = true;
  const uint64_t token = ++stop_token_[f.server];
  // Silent for heartbeat_timeout: the scheduler declares it dead.
  at(now_ + kHeartbeatTimeoutUs, [this, f, token] {
    if (stopped_[f.server] && stop_token_[f.server] == token)
      lose(f.server, "no heartbeat for 2000 ms");
  });
  if (f.continue_after_us > 0)
    at(now_ + f.continue_after_us, [this, f] {
      if (dead_[f.server] || !stopped_[f.server]) return;
      stopped_[f.server] = false;
      // A zombie when it was failed over meanwhile: it reads what its
      // sockets hold, the scheduler's abort last, and acts on it.
      auto inbox = std::move(inbox_[f.server]);
      for (auto& [from, gen, m] : inbox) {
        if (dead_[f.server]) break;
        if (links_[{from, server_node(f.server)}].gen == gen || from == kScheduler)
          handle(server_node(f.server), from, m);
      }
    });
}

void World::lose(int server, const std::string& why) {
  if (job_failed_) return;
  // Dead already and not restarting: nothing new (a restarted server lost
  // while catching up is lost again: a new placement, below).
  if (placement_.dead[server] && !placement_.restarting[server]) return;
  placement_.dead[server] = true;
  placement_.late[server] = 0;
  placement_.restarting[server] = false;
  if (int home = cluster::first_lost_home(s_.servers, s_.replicas, placement_.dead); home >= 0) {
    job_failed_ = true;
    out_.failed_cleanly = true;
    out_.failure = fmt::format("server {} failed ({}); no replica left for the ranges of server {}",
                               server, why, home);
    return;
  }
  placement_.epoch++;
  Msg p;
  p.type = Msg::kPlacement;
  p.placement = placement_;
  for (int r = 0; r < s_.servers; ++r)
    if (r != server && (!placement_.dead[r] || placement_.restarting[r]))
      send(kScheduler, server_node(r), p);
  for (int r = 0; r < s_.workers; ++r)
    send(kScheduler, worker_node(r), p);
  // The failed-over server is told to abort (a stopped one acts on it if it
  // ever wakes up).
  Msg abort;
  abort.type = Msg::kAbort;
  send(kScheduler, server_node(server), abort);
  // The launcher kills a failed-over process and restarts it while its
  // budget lasts (here: once per kill fault that asked for it).
  if (const uint64_t after = std::exchange(restart_after_[server], 0); after > 0)
    at(now_ + after, [this, server] { restart_server(server); });
}

Outcome World::run() {
  for (const Fault& f : s_.faults)
    at(f.at_us, [this, f] { inject(f); });
  // Worker 0 initialises every part.
  inits_left_ = static_cast<int>(parts_.size());
  at(0, [this] {
    for (int p = 0; p < static_cast<int>(parts_.size()); ++p)
      send_request(workers_[0], p, Msg::kInit, 0);
  });
  auto done = [&] {
    return std::all_of(workers_.begin(), workers_.end(),
                       [](const Worker& w) { return w.finished; }) &&
           (s_.sync || pulled_final_);
  };
  while (!events_.empty() && !job_failed_ && !done()) {
    Event e = events_.top();
    events_.pop();
    now_ = e.t;
    if (now_ > kDeadlineUs) break;
    e.fn();
  }
  out_.end_us = now_;
  out_.finished = done();
  if (!out_.finished && !job_failed_) {
    std::string who;
    for (const Worker& w : workers_)
      if (!w.finished)
        who += fmt::format(" worker {} (round {}, {} requests pending)", w.rank, w.round,
                           w.pending.size());
    violation(fmt::format("hang: {} at {} us with nothing left to happen:{}",
                          events_.empty() ? "every event ran" : "past the job's deadline", now_,
                          who));
  }
  return out_;
}

}  // namespace detail

Outcome run(const Scenario& s) {
  detail::World w(s);
  return w.run();
}

}  // namespace pushpull::sim
