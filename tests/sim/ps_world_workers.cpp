// SPDX-License-Identifier: Apache-2.0
// The simulation's worker stores (a model of dist_store*.cpp: sequence
// numbers, requests re-sent on a placement, a replacement's adoption and its
// barrier position) and the scheduler's barriers (the real BarrierBook).
#include <fmt/format.h>

#include "sim/ps_world_impl.h"

namespace pushpull::sim::detail {

void World::kill_worker(int rank, uint64_t restart_after) {
  Worker& w = workers_[static_cast<size_t>(rank)];
  if (w.dead || w.finished) return;
  w.dead = true;
  const int node = worker_node(rank);
  close_dead(node);
  // The scheduler sees the close after what the worker sent it: away (its
  // barrier arrivals go; the barrier waits for its replacement); then the
  // launcher's restart.
  const uint64_t lost = std::max(now_, links_[{node, kScheduler}].last) + 1;
  at(lost, [this, rank] { barriers_.lose({Role::kWorker, rank}); });
  at(std::max(lost, now_ + restart_after) + 1, [this, rank] { restart_worker(rank); });
}

void World::restart_worker(int rank) {
  if (job_failed_) return;
  Worker& w = workers_[static_cast<size_t>(rank)];
  const int node = worker_node(rank);
  for (int n = 0; n <= s_.servers + s_.workers; ++n) {  // new connections
    links_[{node, n}] = Link{links_[{node, n}].gen + 1, 0, false};
    links_[{n, node}] = Link{links_[{n, node}].gen + 1, 0, false};
  }
  for (int s = 0; s < s_.servers; ++s)
    if (placement_.dead[s] && !placement_.restarting[s]) close(node, server_node(s));
  const int incarnation = w.incarnation + 1;
  w = Worker{};
  w.rank = rank;
  w.incarnation = incarnation;
  w.next_rid = (static_cast<uint64_t>(incarnation) << 40) + 1;
  w.view = placement_;  // the scheduler sends it first
  // init: adopt every part's value and counts (kPull with the rejoin flag).
  for (int p = 0; p < static_cast<int>(parts_.size()); ++p)
    send_request(w, p, Msg::kRejoin, 0);
}

void World::on_scheduler(int from, const Msg& m) {
  if (!is_worker(from)) return;
  const int rank = from - worker_node(0);
  if (m.type == Msg::kBarrierPass) {
    barriers_.pass(rank, m.seq);
    for (uint8_t g : barriers_.waiting_groups()) {
      std::vector<cluster::BarrierBook::Member> all;
      for (int r = 0; r < s_.workers; ++r)
        all.emplace_back(Role::kWorker, r);
      barrier_done(barriers_.settle(g, all));
    }
    return;
  }
  if (m.type != Msg::kBarrier) return;
  std::vector<cluster::BarrierBook::Member> all;
  for (int r = 0; r < s_.workers; ++r)
    all.emplace_back(Role::kWorker, r);
  barrier_done(barriers_.arrive(1, {Role::kWorker, rank}, static_cast<transport::ConnId>(from),
                                m.seq, m.tag, all));
}

void World::barrier_done(const std::vector<cluster::BarrierBook::Answer>& answers) {
  for (const auto& a : answers) {
    Msg done;
    done.type = Msg::kBarrierDone;
    done.seq = a.count;
    send(kScheduler, static_cast<int>(a.conn), std::move(done));
  }
}

void World::after_round(Worker& w) {
  if (w.round >= s_.rounds) {
    w.finished = true;
    if (!s_.sync &&
        std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) { return x.finished; }))
      final_pulls();
    return;
  }
  if (s_.barrier_every > 0 && w.round % s_.barrier_every == 0) {
    // kv.barrier() at an epoch's end, tagged with the worker's position.
    if (w.position != w.tag_position) {
      w.tag_position = w.position;
      w.tag_seq = 0;
    }
    Msg b;
    b.type = Msg::kBarrier;
    b.seq = ++w.barriers;
    b.tag = {true, w.tag_position, ++w.tag_seq};
    w.in_barrier = true;
    send(worker_node(w.rank), kScheduler, std::move(b));
    return;
  }
  start_round(w);
}

int World::primary(const Worker& w, int part) const {
  return cluster::replica_chain(parts_[part].home, s_.servers, s_.replicas, w.view.dead,
                                w.view.late)
      .primary;
}

void World::send_request(Worker& w, int part, Msg::Type type, uint64_t seq) {
  const int server = primary(w, part);
  const uint64_t rid = w.next_rid++;
  w.pending[rid] = {part, type, seq, server};
  w.current[part] = rid;
  if (server < 0) return;  // the job fails (no replica left)
  Msg m;
  m.type = type;
  m.request_id = rid;
  m.part = part;
  m.seq = seq;
  m.epoch = w.view.epoch;
  if (type == Msg::kInit) m.values = initial_[part];
  if (type == Msg::kPush)
    m.values.assign(static_cast<size_t>(parts_[part].count), static_cast<float>(w.rank + 1));
  send(worker_node(w.rank), server_node(server), std::move(m));
}

void World::start_round(Worker& w) {
  if (w.pass_due) {
    // A replacement's first push: past every barrier at its position.
    w.pass_due = false;
    Msg pass;
    pass.type = Msg::kBarrierPass;
    pass.seq = w.position;
    send(worker_node(w.rank), kScheduler, std::move(pass));
  }
  ++w.round;
  w.position += parts_.size();
  w.got.clear();
  for (int p = 0; p < static_cast<int>(parts_.size()); ++p)
    send_request(w, p, Msg::kPush, static_cast<uint64_t>(w.round));
}

void World::on_reply(Worker& w, const Msg& in) {
  Msg m = in;
  if (m.type == Msg::kReply && m.values.empty() && !m.bytes.empty()) {
    m.values.resize(m.bytes.size() / sizeof(float));
    std::memcpy(m.values.data(), m.bytes.data(), m.values.size() * sizeof(float));
  }
  auto it = w.pending.find(m.request_id);
  if (it == w.pending.end()) return;
  const Worker::Pending p = it->second;
  w.pending.erase(it);
  if (w.current[p.part] != m.request_id) return;  // superseded by a re-send
  if (m.type == Msg::kError) {
    violation(fmt::format("worker {}: {} of part {} (round {}) refused: {}", w.rank,
                          p.type == Msg::kInit ? "init" : "push", parts_[p.part].name, p.seq,
                          m.text));
    job_failed_ = true;
    return;
  }
  w.current.erase(p.part);
  if (p.type == Msg::kRejoin) {
    uint64_t applied = 0, accepted = 0;
    if (Status st = ps::decode_rejoin(m.bytes, &applied, &accepted); !st) {
      violation(fmt::format("worker {}: bad rejoin answer: {}", w.rank, st.message()));
      job_failed_ = true;
      return;
    }
    w.applied[p.part] = applied;
    if (!w.current.empty()) return;
    // Resume after the rounds every part completed (restart_round()).
    uint64_t round = UINT64_MAX;
    for (const auto& [part, a] : w.applied)
      round = std::min(round, a);
    w.round = static_cast<int>(round);
    w.position = round * parts_.size();
    w.pass_due = s_.sync;
    if (w.round >= s_.rounds) return after_round(w);  // its predecessor had finished
    return start_round(w);
  }
  if (p.type == Msg::kInit) {
    if (--inits_left_ == 0) all_inited();
    return;
  }
  if (p.type == Msg::kPull) {
    std::vector<float> want = initial_[p.part];
    const float total = 0.5f * static_cast<float>(s_.rounds * s_.workers * (s_.workers + 1) / 2);
    for (float& x : want)
      x += total;
    if (m.values != want)
      violation(fmt::format("dist_async: part {} holds {} after every push; exactly {} expected",
                            parts_[p.part].name, fmt::join(m.values, ","), fmt::join(want, ",")));
    if (w.current.empty()) w.finished = true;
    return;
  }
  if (s_.sync) w.got[p.part] = m.values;
  if (!w.current.empty()) return;  // the round's other parts
  check_round(w);
  after_round(w);
}

void World::check_round(Worker& w) {
  if (!s_.sync) return;
  for (size_t p = 0; p < parts_.size(); ++p)
    if (w.got[static_cast<int>(p)] != expected_[static_cast<size_t>(w.round)][p])
      violation(fmt::format("worker {} round {} part {}: pulled {}, expected {}", w.rank, w.round,
                            parts_[p].name, fmt::join(w.got[static_cast<int>(p)], ","),
                            fmt::join(expected_[static_cast<size_t>(w.round)][p], ",")));
}

void World::final_pulls() {
  // dist_async: every push acknowledged; worker 0 pulls every part.
  Worker& w = workers_[0];
  w.finished = false;
  pulled_final_ = true;
  for (int p = 0; p < static_cast<int>(parts_.size()); ++p)
    send_request(w, p, Msg::kPull, 0);
}

void World::on_placement(Worker& w, const Placement& p) {
  if (p.epoch <= w.view.epoch) return;
  const Placement old = w.view;
  w.view = p;
  for (int s = 0; s < s_.servers; ++s)
    if (p.dead[s] && !old.dead[s]) close_for_placement(worker_node(w.rank), s);
  // Re-send what was pending on a server that is no longer its part's primary.
  std::vector<Worker::Pending> again;
  for (auto it = w.pending.begin(); it != w.pending.end();) {
    if (w.current[it->second.part] == it->first &&
        primary(w, it->second.part) != it->second.server) {
      again.push_back(it->second);
      it = w.pending.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& r : again)
    send_request(w, r.part, r.type, r.seq);
}

void World::all_inited() {
  inited_ = true;
  // The barrier after init: every worker starts its rounds.
  for (Worker& w : workers_)
    at(now_ + 100, [this, &w] { start_round(w); });
}

}  // namespace pushpull::sim::detail
