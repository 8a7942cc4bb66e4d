// SPDX-License-Identifier: Apache-2.0
// The collectives' control plane at scale (scale_sim.h): n ranks meeting at
// rank 0's rendezvous, forming their mesh (a full mesh as today, or the
// sparse topology of issue 38), negotiating two allreduces through rank 0's
// real Coordinator, running the first, announcing the second (a repeat,
// from the cache) directly to rank 0 and then again over the negotiation
// tree (real TreeAggregators, collective/negotiation_tree.h; scale_negotiation.cpp),
// then watching each other until a rank is stopped or killed. What is real and what is modeled:
// scale_sim.h. Private to scale_collective*.cpp: start-up, negotiation and the allreduce here; the
// detector and the run in scale_collective.cpp. Thread safety: none (one thread).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>

#include "base/liveness.h"
#include "collective/coordinator.h"
#include "collective/messages.h"
#include "collective/negotiation_tree.h"
#include "collective/store.h"
#include "collective/tcp_store.h"
#include "sim/scale_net.h"
#include "transport/message.h"

namespace pushpull::sim::scale::detail {

inline constexpr uint64_t kHeader = transport::kHeaderBytes;
inline constexpr uint64_t kNever = UINT64_MAX;
using Vec = std::array<float, 4>;

// Ranks local_size to a host, as the sparse topology's local ranks assume;
// the port tells a host's ranks apart.
inline std::string host_of(int rank, int local_size) {
  const int host = rank / local_size;
  return fmt::format("10.1.{}.{}", host / 250, host % 250 + 1);
}

// The ranks `r` exchanges with in halving_doubling.cpp's recursive doubling,
// in step order: the fold partner (non-powers of two) and the doubling
// partners. fold: -1, or the rank r hands its vector to / gets it from.
struct Doubling {
  int fold = -1;
  bool sits_out = false;
  std::vector<int> partners;
};
inline Doubling doubling(int r, int n) {
  int p = 1;
  while (p * 2 <= n)
    p *= 2;
  const int rem = n - p;
  Doubling d;
  int idx = r - rem;  // index among the p that remain
  if (r < 2 * rem) {
    d.fold = r % 2 == 0 ? r + 1 : r - 1;
    d.sits_out = r % 2 == 0;
    idx = r / 2;
  }
  if (d.sits_out) return d;
  auto rank_of = [rem](int i) { return i < rem ? 2 * i + 1 : i + rem; };
  for (int bit = 1; bit < p; bit *= 2)
    d.partners.push_back(rank_of(idx ^ bit));
  return d;
}

class CollectiveWorld {
 public:
  explicit CollectiveWorld(const Config& c)
      : c_(c),
        n_(c.ranks),
        full_(c.topology == Topology::kFullMesh),
        net_(c.ranks, c.costs),
        victim_(c.victim >= 0 ? c.victim : c.ranks - 1),
        have_(static_cast<size_t>(n_), 0),
        want_(static_cast<size_t>(n_), 0),
        value_(static_cast<size_t>(n_)),
        step_(static_cast<size_t>(n_), -1),
        early_(static_cast<size_t>(n_)),
        decided_(static_cast<size_t>(n_), kNever),
        planned_(static_cast<size_t>(n_), kNever),
        cache_(4096),
        coordinator_(n_, CollectiveOptions{}, cache_),
        live_(static_cast<size_t>(n_), false) {}
  Report run();

 private:
  // The sparse topology (issue 38): ring neighbours, the doubling partners,
  // the host's local ranks. Symmetric.
  std::vector<int> neighbours(int r) const {
    std::vector<int> out;
    if (full_) {
      for (int p = 0; p < n_; ++p)
        if (p != r) out.push_back(p);
      return out;
    }
    out = {(r + 1) % n_, (r + n_ - 1) % n_};
    const Doubling d = doubling(r, n_);
    if (d.fold >= 0) out.push_back(d.fold);
    out.insert(out.end(), d.partners.begin(), d.partners.end());
    const int host = r / c_.local_size;
    for (int p = host * c_.local_size; p < std::min(n_, (host + 1) * c_.local_size); ++p)
      out.push_back(p);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    out.erase(std::remove(out.begin(), out.end(), r), out.end());
    return out;
  }
  // Heartbeats: to every peer (full), to the two ring neighbours (sparse).
  int heartbeat_degree() const { return full_ ? n_ - 1 : (n_ > 2 ? 2 : 1); }
  bool watches(int w, int v) const {
    return w != v && (full_ || (w + 1) % n_ == v || (v + 1) % n_ == w);
  }

  // bootstrap.cpp kRendezvous over the MASTER_ADDR store (store.h): every
  // rank dials rank 0 and sets its entry (the get of the book that follows
  // is held there: it is counted with the set); rank 0 answers every get
  // with its verdict once all arrived.
  void rendezvous(int r) {
    net_.connect(r, 0, [this, r] {
      auto set = collective::encode_store_request(
          fmt::format("rank/{}", r),
          collective::encode_entry(n_, host_of(r, c_.local_size), 41000 + r % 20000));
      net_.send(r, 0, 2 * kHeader + set.size() + 8, [this] {
        if (++hellos_ < n_ - 1) return;
        collective::AddressList book;
        for (int p = 0; p < n_; ++p)
          book.emplace_back(host_of(p, c_.local_size), 41000 + p % 20000);
        auto bytes =
            std::make_shared<const std::vector<std::byte>>(collective::encode_verdict({}, book));
        for (int p = 1; p < n_; ++p)
          net_.send(0, p, kHeader + bytes->size(), [this, p, bytes] {
            collective::AddressList got;
            Status verdict;
            if (!collective::decode_verdict(*bytes, &verdict, &got) || !verdict.is_ok() ||
                got.size() != static_cast<size_t>(n_))
              return fail_run("a rendezvous book does not decode");
            mesh(p);
          });
        mesh(0);
      });
    });
  }
  // TcpTransport::connect_all: today one dial after another to every lower
  // rank; the sparse design dials its lower neighbours all at once. Each
  // pair also opens its data stream.
  void mesh(int r) {
    std::vector<int> lower;
    int higher = 0;
    for (int p : neighbours(r)) {
      if (p < r)
        lower.push_back(p);
      else
        ++higher;
    }
    want_[static_cast<size_t>(r)] += static_cast<int>(lower.size()) + higher;
    if (full_) {
      dial_next(r, std::make_shared<std::vector<int>>(std::move(lower)), 0);
    } else {
      for (int p : lower)
        net_.connect(
            r, p, [this, r] { up(r); }, [this, p] { up(p); }, true);
    }
    up(r, 0);
  }
  void dial_next(int r, std::shared_ptr<std::vector<int>> lower, size_t i) {
    if (i == lower->size()) return;
    const int p = (*lower)[i];
    net_.connect(
        r, p, [this, r, lower, i] { up(r), dial_next(r, lower, i + 1); }, [this, p] { up(p); },
        true);
  }
  void up(int r, int k = 1) {
    auto& have = have_[static_cast<size_t>(r)];
    have += k;
    if (have != want_[static_cast<size_t>(r)] || want_[static_cast<size_t>(r)] == 0) return;
    want_[static_cast<size_t>(r)] = -1;  // ready once
    start_liveness(r);
    if (++ready_ == n_) {
      startup_done_ = net_.now();
      startup_counts_ = net_.counts();
      for (int p = 0; p < n_; ++p)
        announce(p, true);
    }
  }

  // The engine: every rank announces the op to rank 0 (the real encoding);
  // rank 0's real Coordinator answers once all did.
  void announce(int r, bool first) {
    collective::Spec spec;
    spec.name = "probe.0";
    spec.shape = Shape{4};
    collective::Announce a;
    if (first)
      a.specs.push_back(spec);
    else
      a.cached.push_back(cache_id_);
    auto bytes = collective::encode(a);
    auto submit = [this, r, spec, first, bytes] {
      collective::Announce got;
      if (!collective::decode_announce(std::as_bytes(std::span(bytes)), n_, &got))
        return fail_run("an announcement does not decode");
      const auto tp = collective::Clock::time_point(std::chrono::microseconds(net_.now()));
      if (first)
        coordinator_.submit(r, got.specs.at(0), tp);
      else
        coordinator_.submit_cached(r, got.cached.at(0), tp);
      if (++announced_ == n_) respond(first);
    };
    if (r == 0) return submit();
    op_bytes_[first ? 0 : 1] += kHeader + bytes.size();
    net_.send(r, 0, kHeader + bytes.size(), submit);
  }
  void respond(bool first) {
    announced_ = 0;
    std::vector<collective::StallReport> stalls;
    const auto tp = collective::Clock::time_point(std::chrono::microseconds(net_.now()));
    auto rs = coordinator_.poll(tp, &stalls);
    if (rs.empty()) {  // a small allreduce waiting for its cycle
      const auto next = coordinator_.next_deadline(tp).time_since_epoch();
      const auto at = std::chrono::duration_cast<std::chrono::microseconds>(next).count();
      announced_ = n_;
      net_.at(static_cast<uint64_t>(at), [this, first] { respond(first); });
      return;
    }
    if (rs.size() != 1 || rs[0].tensors.size() != 1)
      return fail_run("the coordinator did not answer with one allreduce");
    cache_id_ = rs[0].tensors[0].cache_id;
    auto bytes = std::make_shared<const std::string>(collective::encode(rs));
    op_bytes_[first ? 0 : 1] += static_cast<double>((n_ - 1) * (kHeader + bytes->size()));
    for (int p = 0; p < n_; ++p) {
      auto run = [this, p, bytes, first] {
        auto got = collective::decode_responses(*bytes, n_);
        if (got.size() != 1) return fail_run("a response does not decode");
        if (first)
          start_allreduce(p);
        else if (++direct_got_ == n_)
          tree_round();  // the same repeat again, over the tree
      };
      if (p == 0)
        run();
      else
        net_.send(0, p, kHeader + bytes->size(), run);
    }
  }
  // halving_doubling.cpp's recursive doubling of 4 floats: rank r holds 1 + r.
  void start_allreduce(int r) {
    value_[static_cast<size_t>(r)] = {1.0f + r, 1.0f + r, 1.0f + r, 1.0f + r};
    const Doubling d = doubling(r, n_);
    auto& step = step_[static_cast<size_t>(r)];
    if (d.sits_out) {  // hands its vector over, waits for the result
      step = 0;
      return send_value(r, d.fold, 0);
    }
    if (d.fold >= 0) {  // waits for the fold's vector (step 0), maybe already here
      step = 0;
      auto& early = early_[static_cast<size_t>(r)];
      if (auto it = early.find(0); it != early.end()) {
        Vec v = it->second;
        early.erase(it);
        receive(r, 0, v);
      }
      return;
    }
    step = 1;
    exchange(r);
  }
  // Steps: 0 the fold, 1..k the doubling partners, k+1 the fold's return.
  void send_value(int from, int to, int step) {
    const Vec v = value_[static_cast<size_t>(from)];
    net_.send(from, to, kHeader + sizeof(Vec), [this, to, step, v] { receive(to, step, v); });
  }
  void exchange(int r) {
    const Doubling d = doubling(r, n_);
    const int s = step_[static_cast<size_t>(r)];
    if (s > static_cast<int>(d.partners.size())) {
      if (d.fold >= 0) send_value(r, d.fold, s);
      return finish(r);
    }
    send_value(r, d.partners[static_cast<size_t>(s - 1)], s);
    auto& early = early_[static_cast<size_t>(r)];
    if (auto it = early.find(s); it != early.end()) {
      Vec v = it->second;
      early.erase(it);
      receive(r, s, v);
    }
  }
  // step_: -1 before the rank started (its response not yet here).
  void receive(int r, int step, const Vec& v) {
    auto& mine = value_[static_cast<size_t>(r)];
    const Doubling d = doubling(r, n_);
    if (d.sits_out) {  // the result returned (it started: it sent first)
      mine = v;
      return finish(r);
    }
    if (step != step_[static_cast<size_t>(r)]) {  // ahead of this rank: kept
      early_[static_cast<size_t>(r)][step] = v;
      return;
    }
    for (size_t i = 0; i < mine.size(); ++i)
      mine[i] += v[i];
    step_[static_cast<size_t>(r)] = step + 1;
    exchange(r);
  }
  void finish(int r) {
    const float want = static_cast<float>(n_) * static_cast<float>(n_ + 1) / 2;
    for (float x : value_[static_cast<size_t>(r)])
      if (x != want) return fail_run(fmt::format("rank {} reduced to {}, want {}", r, x, want));
    if (++reduced_ == n_) {
      round_end_ = net_.now();
      for (int p = 0; p < n_; ++p)
        announce(p, false);  // the repeat, answered from the cache
    }
  }

  // The repeat over the negotiation tree (scale_negotiation.cpp): every
  // rank's aggregator, the real encoding up, rank 0's Coordinator, the
  // response forwarded down by each rank to its children.
  void tree_round();
  void tree_flush(int r);
  void tree_poll();
  void tree_down(int r, const std::shared_ptr<const std::string>& bytes);

  // tcp_transport_liveness.cpp: heartbeats every interval; the victim's
  // are delivered one by one to the real detectors of its watchers, the
  // others' only counted (they refresh timers that cannot expire).
  void start_liveness(int r);
  void beat(int r);
  void heard(int w);
  void check(int w);
  void decide(int w, const std::string& why);
  void inject();
  void fail_run(std::string why) {
    if (report_.failure.empty()) report_.failure = std::move(why);
  }

  Config c_;
  int n_;
  bool full_;
  Net net_;
  int victim_;
  std::vector<int> have_, want_;
  int hellos_ = 0, ready_ = 0, announced_ = 0, reduced_ = 0;
  std::vector<Vec> value_;
  std::vector<int> step_;
  std::vector<std::map<int, Vec>> early_;
  std::vector<uint64_t> decided_, planned_;
  std::map<int, SilenceDetector<int>> detectors_;  // the victim's watchers'
  collective::ResponseCache cache_;
  collective::Coordinator coordinator_;
  uint32_t cache_id_ = collective::kNoCacheId;
  double op_bytes_[2] = {0, 0};
  std::vector<std::unique_ptr<collective::TreeAggregator>> aggs_;
  int direct_got_ = 0, tree_got_ = 0, tree_hub_messages_ = 0;
  double tree_hub_bytes_ = 0;
  uint64_t tree_start_ = 0, tree_end_ = 0;
  int decided_count_ = 0, live_count_ = 0;
  std::vector<bool> live_;  // started its detector (after its mesh)
  bool injected_ = false;
  bool second_done_ = false;
  uint64_t startup_done_ = 0, round_end_ = 0, fault_at_ = 0;
  std::vector<Count> startup_counts_;
  Report report_;
};

}  // namespace pushpull::sim::scale::detail
