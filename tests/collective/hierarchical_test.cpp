// SPDX-License-Identifier: Apache-2.0
// Hierarchical allreduce (src/collective/hierarchical.h) with ranks as
// threads and a fake host identity per rank: the choice of the hierarchy,
// the algorithm over every transport (in-process, TCP with direct streams,
// shared memory) against locally computed references (every dtype and
// reduction, sizes not divisible by the ranks per host, tiny and pipelined
// vectors, hosts whose ranks are interleaved), the engine choosing it from
// CommunicatorOptions::hosts (seen in which peers a rank sends data to), and
// the environment variable.
#include "collective/hierarchical.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "collective/hierarchical_view.h"
#include "fabrics.h"
#include "group.h"
#include "harness.h"
#include "pushpull/collective.h"

namespace pushpull::collective {

using transport::Clock;
using transport::Completion;
using transport::InProcessFabric;
using transport::irecv;
using transport::isend;
using transport::kControlTagBit;
using transport::Request;
using transport::Transport;

namespace {

using testing::Kind;
using testing::make_input;
using testing::reference;

const std::vector<std::string> k2x2 = {"a", "a", "b", "b"};

// ---- choosing the hierarchy ------------------------------------------------

TEST(HierarchyChoice, TwoHostsOfTwoRanksIsChosenAutomatically) {
  std::string note;
  auto h = choose_hierarchy(k2x2, 3, -1, &note);
  ASSERT_TRUE(h.has_value()) << note;
  EXPECT_EQ(h->hosts, 2);
  EXPECT_EQ(h->local_size, 2);
  EXPECT_EQ(h->host, 1);
  EXPECT_EQ(h->local_rank, 1);
  EXPECT_EQ(h->local_members, (std::vector<int>{2, 3}));
  EXPECT_EQ(h->cross_members, (std::vector<int>{1, 3}));
  EXPECT_EQ(note, "2 hosts x 2 ranks (automatic)");
}

TEST(HierarchyChoice, InterleavedHostsGroupByIdentityAndOrderByLowestRank) {
  const std::vector<std::string> hosts = {"y", "x", "y", "x", "y", "x"};
  auto h = choose_hierarchy(hosts, 3, -1);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->host, 1);  // "x" holds rank 1, after "y"'s rank 0
  EXPECT_EQ(h->local_members, (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(h->local_rank, 1);
  EXPECT_EQ(h->cross_members, (std::vector<int>{2, 3}));
  EXPECT_EQ(group_by_host(hosts), (std::vector<std::vector<int>>{{0, 2, 4}, {1, 3, 5}}));
}

TEST(HierarchyChoice, FlatWhenOneHostOneRankPerHostUnevenUnknownOrOff) {
  std::string note;
  EXPECT_FALSE(choose_hierarchy({"a", "a", "a", "a"}, 0, -1, &note));
  EXPECT_EQ(note, "not used: every rank is on one host");
  EXPECT_FALSE(choose_hierarchy({"a", "b", "c"}, 0, -1, &note));
  EXPECT_EQ(note, "not used: one rank per host");
  EXPECT_FALSE(choose_hierarchy({"a", "a", "a", "b"}, 0, -1, &note));
  EXPECT_EQ(note,
            "not used: the hosts hold different numbers of ranks (3, 1); the flat ring runs "
            "instead");
  EXPECT_FALSE(choose_hierarchy({"a", "a", "a", "b"}, 0, 1, &note));  // forcing cannot fix that
  EXPECT_FALSE(choose_hierarchy({}, 0, -1, &note));
  EXPECT_EQ(note, "not used: the ranks' hosts are not known");
  EXPECT_FALSE(choose_hierarchy(k2x2, 0, 0, &note));
  EXPECT_EQ(note, "off (PUSHPULL_HIERARCHICAL_ALLREDUCE=0)");
}

TEST(HierarchyChoice, ForcedOnOneHostOrOneRankPerHost) {
  auto one_host = choose_hierarchy({"a", "a", "a"}, 2, 1);
  ASSERT_TRUE(one_host);
  EXPECT_EQ(one_host->hosts, 1);
  EXPECT_EQ(one_host->cross_members, (std::vector<int>{2}));
  auto spread = choose_hierarchy({"a", "b", "c"}, 1, 1);
  ASSERT_TRUE(spread);
  EXPECT_EQ(spread->local_size, 1);
  EXPECT_EQ(spread->cross_members, (std::vector<int>{0, 1, 2}));
}

TEST(HierarchyChoice, EnvironmentVariableForcesEitherWay) {
  EXPECT_EQ(Options::from_env(Environment{}).collective.hierarchical_allreduce, -1);
  EXPECT_EQ(Options::from_env({{"PUSHPULL_HIERARCHICAL_ALLREDUCE", "1"}})
                .collective.hierarchical_allreduce,
            1);
  EXPECT_EQ(Options::from_env({{"PUSHPULL_HIERARCHICAL_ALLREDUCE", "0"}})
                .collective.hierarchical_allreduce,
            0);
  EXPECT_EQ(Options::from_env({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "1"}})
                .collective.hierarchical_allreduce,
            1);
  EXPECT_EQ(Options::from_env({{"PUSHPULL_HIERARCHICAL_ALLREDUCE", ""}})
                .collective.hierarchical_allreduce,
            -1);
  EXPECT_THROW(Options::from_env({{"PUSHPULL_HIERARCHICAL_ALLREDUCE", "maybe"}}), InvalidArgument);
}

TEST(SubgroupView, TranslatesRanksAndRefusesStrangers) {
  testing::run_ranks(4, [](int r, Transport& t) {
    if (r % 2) {
      SubgroupTransport odd(t, {1, 3}, true);
      EXPECT_EQ(odd.rank(), r / 2);
      EXPECT_EQ(odd.size(), 2);
      EXPECT_EQ(odd.base_rank(1), 3);
      EXPECT_FALSE(odd.direct());  // the in-process transport has no path of its own
      int v = r, got = -1;
      Request s = isend(odd, 1 - odd.rank(), 5, &v, sizeof v);
      irecv(odd, 1 - odd.rank(), 5, &got, sizeof got).wait(Clock::now() + Millis(5000), "recv");
      s.wait(Clock::now() + Millis(5000), "send");
      EXPECT_EQ(got, r == 1 ? 3 : 1);
    } else {
      EXPECT_THROW(SubgroupTransport(t, {1, 3}, true), InvalidArgument);
      EXPECT_THROW(SubgroupTransport(t, {r, 9}, true), InvalidArgument);
    }
  });
}

// ---- the algorithm over every transport -------------------------------------

class Hierarchical : public ::testing::TestWithParam<Kind> {
 protected:
  // Every rank allreduces its input through the hierarchy of `hosts`; each
  // result is checked against the local reference.
  void check(const std::vector<std::string>& hosts, DType dtype, ReduceOp op, int64_t count,
             uint64_t segment_bytes = 4096) {
    const int n = static_cast<int>(hosts.size());
    std::vector<Array> results(static_cast<size_t>(n));
    const uint64_t op_id = ++calls_;  // the same on every rank
    fabrics_.run(n, [&](int r, Transport& t) {
      auto h = choose_hierarchy(hosts, r, 1);
      ASSERT_TRUE(h.has_value());
      std::vector<char> scratch;
      AlgoContext ctx{t};
      ctx.op_id = op_id;
      ctx.ring_segment_bytes = segment_bytes;
      ctx.scratch = &scratch;
      Array a = make_input(op, dtype, r, count);
      hierarchical_allreduce(ctx, *h, a.data(), static_cast<size_t>(count), dtype, op);
      results[static_cast<size_t>(r)] = std::move(a);
    });
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(get_element(results[static_cast<size_t>(r)], i), reference(op, dtype, n, i))
            << "rank " << r << " element " << i << " of " << count << " " << dtype_name(dtype)
            << " " << reduce_op_name(op) << " over " << n << " ranks";
  }
  testing::Fabrics fabrics_{GetParam()};
  uint64_t calls_ = 0;
};

TEST_P(Hierarchical, EveryDtypeAndOpOnTwoHostsOfTwo) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                          DType::kInt32,   DType::kInt64,   DType::kInt8,     DType::kUInt8};
  for (DType d : dtypes)
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax})
      for (int64_t count : {0, 1, 2, 3, 5, 1001, 20001})
        check(k2x2, d, op, count);
}

TEST_P(Hierarchical, OtherLayouts) {
  const std::vector<std::vector<std::string>> layouts = {
      {"a", "b", "a", "b"},            // ranks of a host interleaved
      {"a", "a", "a", "b", "b", "b"},  // 2 hosts x 3
      {"a", "a", "b", "b", "c", "c"},  // 3 hosts x 2 (a real ring between hosts)
      {"a", "b", "c"},                 // forced with one rank per host: the flat ring
      {"a", "a", "a"}};                // forced on one host: reduce-scatter + allgather
  for (const auto& hosts : layouts)
    for (int64_t count : {1, 4, 7, 4099})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        check(hosts, DType::kFloat32, op, count);
        check(hosts, DType::kInt32, op, count);
      }
}

TEST_P(Hierarchical, LargeVectorsGoThroughThePipeline) {
  // Above kPipelineBytes, chunked; counts divisible neither by the chunks nor by L.
  const int64_t f32 = static_cast<int64_t>(kPipelineBytes / 4) + 12345;
  check(k2x2, DType::kFloat32, ReduceOp::kSum, f32, 256 << 10);
  // Many chunks (capped at kMaxChunks).
  check(k2x2, DType::kInt32, ReduceOp::kSum, (17 << 20) / 4 + 3, 256 << 10);
  check({"a", "b", "a", "b", "a", "b"}, DType::kFloat16, ReduceOp::kMax,
        static_cast<int64_t>(kPipelineBytes / 2) * 3 / 2 + 7, 128 << 10);
}

TEST_P(Hierarchical, ARankDyingInThePipelineFailsEveryRankWithoutWaitingOutTheDeadline) {
  // Rank 3's endpoint closes (it "dies") while the others are in a pipelined
  // allreduce: its host mate and cross-host partner fail at once, and their
  // failure aborts their transports, so rank 0 (which never talks to 3)
  // fails too, long before the 30 s progress deadline.
  const int64_t count = static_cast<int64_t>(kPipelineBytes / 4) * 8;
  const auto start = Clock::now();
  std::vector<std::string> errors(4);
  const uint64_t op_id = ++calls_;
  fabrics_.run(4, [&](int r, Transport& t) {
    auto h = choose_hierarchy(k2x2, r, -1);
    ASSERT_TRUE(h.has_value());
    std::vector<char> scratch;
    AlgoContext ctx{t};
    ctx.op_id = op_id;
    ctx.peer_timeout = Millis(30000);
    ctx.scratch = &scratch;
    if (r == 3) {  // it dies while the others are in the pipeline, waiting for it
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      t.close(Status(ErrorCode::kPeerFailure, "test killed rank 3"));
      return;
    }
    Array a = make_input(ReduceOp::kSum, DType::kFloat32, r, count);
    try {
      hierarchical_allreduce(ctx, *h, a.data(), static_cast<size_t>(count), DType::kFloat32,
                             ReduceOp::kSum);
      errors[static_cast<size_t>(r)] = "no error";
    } catch (const Error& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(errors[static_cast<size_t>(r)], "no error") << "rank " << r;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
}

TEST_P(Hierarchical, ViewsOfferTheStreamsOnlyWhenAsked) {
  fabrics_.run(2, [&](int r, Transport& t) {
    SubgroupTransport with(t, {0, 1}, true), without(t, {0, 1}, false);
    EXPECT_EQ(with.direct(), t.runs_direct_to(1 - r)) << "rank " << r;
    EXPECT_EQ(with.direct(), GetParam() == Kind::kTcp) << "rank " << r;  // only TCP has streams
    EXPECT_FALSE(without.direct());
    EXPECT_FALSE(without.runs_direct_to(1 - r));
  });
}

INSTANTIATE_TEST_SUITE_P(EveryTransport, Hierarchical,
                         ::testing::Values(Kind::kInProcess, Kind::kTcp, Kind::kShm),
                         [](const auto& info) { return testing::kind_name(info.param); });

// ---- the engine picks it ------------------------------------------------------

// An endpoint that remembers to which peers it sent collective data (not the
// engine's control messages).
class Recording final : public Transport {
 public:
  explicit Recording(std::unique_ptr<Transport> t) : t_(std::move(t)) {}
  int rank() const override { return t_->rank(); }
  int size() const override { return t_->size(); }
  void post_send(int peer, uint64_t tag, const void* data, size_t bytes, Completion done) override {
    if (!(tag & kControlTagBit)) {
      std::lock_guard lock(mu_);
      data_peers_.insert(peer);
    }
    t_->post_send(peer, tag, data, bytes, std::move(done));
  }
  void post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) override {
    t_->post_recv(peer, tag, dst, bytes, std::move(done));
  }
  void close(const Status& reason) override { t_->close(reason); }
  std::set<int> data_peers() {
    std::lock_guard lock(mu_);
    return data_peers_;
  }

 private:
  std::unique_ptr<Transport> t_;
  std::mutex mu_;
  std::set<int> data_peers_;
};

struct RecordedGroup {
  InProcessFabric fabric;
  std::vector<Recording*> ends;
  std::vector<std::unique_ptr<Communicator>> comms;
  RecordedGroup(const std::vector<std::string>& hosts, int mode)
      : fabric(static_cast<int>(hosts.size())) {
    for (int r = 0; r < fabric.size(); ++r) {
      auto rec = std::make_unique<Recording>(fabric.endpoint(r));
      ends.push_back(rec.get());
      CommunicatorOptions o = testing::fast_options();
      o.hosts = hosts;
      o.collective.hierarchical_allreduce = mode;
      comms.push_back(std::make_unique<Communicator>(std::move(rec), o));
    }
  }
  void run(const std::function<void(int, Communicator&)>& fn) {
    testing::on_threads(static_cast<int>(comms.size()),
                        [&](int r) { fn(r, *comms[static_cast<size_t>(r)]); });
  }
};

double expected(Reduction red, DType dtype, int n, int64_t i) {
  const ReduceOp op = red == Reduction::kMin   ? ReduceOp::kMin
                      : red == Reduction::kMax ? ReduceOp::kMax
                                               : ReduceOp::kSum;
  double v = reference(op, dtype, n, i);
  if (red != Reduction::kAverage) return v;
  return is_floating(dtype) ? v / n : std::trunc(v / n);
}

ReduceOp input_op(Reduction red) {
  return red == Reduction::kMin   ? ReduceOp::kMin
         : red == Reduction::kMax ? ReduceOp::kMax
                                  : ReduceOp::kSum;
}

TEST(HierarchicalEngine, SumAverageMinMaxFusedAndSingleAndNoCrossHostPairsOutsideTheHierarchy) {
  RecordedGroup g(k2x2, -1);
  const int n = 4;
  g.run([&](int r, Communicator& c) {
    for (DType d : {DType::kFloat32, DType::kFloat16, DType::kInt32, DType::kUInt8})
      for (Reduction red : {Reduction::kSum, Reduction::kAverage, Reduction::kMin, Reduction::kMax})
        for (int64_t count : {1, 3, 1001, 300001}) {
          // Several at once (fused below 1 MiB), each checked.
          std::vector<Array> ins, outs;
          std::vector<Handle> hs;
          for (int k = 0; k < 3; ++k) {
            ins.push_back(make_input(input_op(red), d, r, count + k));
            outs.emplace_back(Shape{count + k}, d);
          }
          for (int k = 0; k < 3; ++k)
            hs.push_back(c.allreduce_async(
                fmt::format("t{}.{}.{}.{}", dtype_name(d), static_cast<int>(red), count, k),
                ins[static_cast<size_t>(k)].view(), outs[static_cast<size_t>(k)].view(), red));
          for (int k = 0; k < 3; ++k) {
            c.wait(hs[static_cast<size_t>(k)]);
            const Array& o = outs[static_cast<size_t>(k)];
            for (int64_t i = 0; i < count + k; ++i)
              ASSERT_EQ(get_element(o, i), expected(red, d, n, i))
                  << "rank " << r << " " << dtype_name(d) << " " << reduction_name(red) << " count "
                  << count + k << " element " << i;
          }
        }
  });
  // Hosts {0,1} and {2,3}: rank 1 talks to its host mate 0 and its
  // cross-host partner 3, never to 2 (the flat ring's 1 -> 2 hop).
  EXPECT_EQ(g.ends[1]->data_peers(), (std::set<int>{0, 3}));
  EXPECT_EQ(g.ends[2]->data_peers(), (std::set<int>{3, 0}));
}

TEST(HierarchicalEngine, OffMeansTheFlatRing) {
  RecordedGroup g(k2x2, 0);
  g.run([](int r, Communicator& c) {
    Array a = make_input(ReduceOp::kSum, DType::kFloat32, r, 100001);
    c.allreduce("x", a.view());
    for (int64_t i = 0; i < a.numel(); i += 997)
      ASSERT_EQ(get_element(a, i), reference(ReduceOp::kSum, DType::kFloat32, 4, i));
  });
  EXPECT_TRUE(g.ends[1]->data_peers().count(2)) << "the flat ring's 1 -> 2 hop";
}

TEST(HierarchicalEngine, JoinedRanksAndProcessSetsContributeTheIdentity) {
  RecordedGroup g(k2x2, 1);
  g.run([](int r, Communicator& c) {
    // Process set {0, 3}: one rank of each host; average over the members.
    if (r == 0 || r == 3) {
      Array a = Array::full(Shape{5}, static_cast<double>(r + 1));
      c.wait(c.allreduce_async("set", a.view(), a.view(), Reduction::kAverage, {0, 3}));
      EXPECT_EQ(a.as<float>()[4], 2.5f);
    }
    // Rank 2 joins at once; the others reduce one tensor without it.
    if (r != 2) {
      Array b = Array::full(Shape{9}, 2.0);
      c.allreduce("after-join", b.view(), Reduction::kSum);
      EXPECT_EQ(b.as<float>()[8], 6.0f);
    }
    c.join();
  });
}

}  // namespace
}  // namespace pushpull::collective
