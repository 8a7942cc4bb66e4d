// SPDX-License-Identifier: Apache-2.0
// Tests of pushpull::torch::Trainer and the multi-device helpers.
//
// Equivalence: W workers x D devices, each device taking a shard of b samples,
// end k SGD steps with the same weights as one plain libtorch process taking
// the union batch of W*D*b samples. The setups run the workers in one store,
// in a child process (this binary in --equivalence-worker mode, so the
// multi-process plumbing is exercised), and later through `pushpull launch`.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/kvstore.h"
#include "pushpull/torch/replicas.h"
#include "pushpull/torch/trainer.h"
#include "support/process.h"

namespace {

using pushpull::InvalidArgument;
using pushpull::KVStore;
using pushpull::OptimizerSpec;
using pushpull::torch::ReplicaRunner;
using pushpull::torch::Trainer;
using pushpull::torch::TrainerOptions;
using Replicas = std::vector<pushpull::torch::ParameterList>;

constexpr int kSteps = 4;
constexpr int kShard = 6;  // samples per device per step
constexpr double kLr = 0.5;
constexpr uint64_t kDataSeed = 7;

torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 3, 3)),
                               torch::nn::Tanh(), torch::nn::Flatten(),
                               torch::nn::Linear(3 * 6 * 6, 10));
}

// Union batches of `shards` x kShard samples, the same in every process.
struct Data {
  std::vector<torch::Tensor> x, y;
};
Data make_data(int shards) {
  torch::manual_seed(kDataSeed);
  Data d;
  for (int s = 0; s < kSteps; ++s) {
    d.x.push_back(torch::randn({shards * kShard, 1, 8, 8}));
    d.y.push_back(torch::randint(0, 10, {shards * kShard}, torch::kLong));
  }
  return d;
}

torch::Tensor loss_sum(torch::nn::Sequential& m, const torch::Tensor& x, const torch::Tensor& y) {
  namespace F = torch::nn::functional;
  return F::cross_entropy(m->forward(x), y, F::CrossEntropyFuncOptions().reduction(torch::kSum));
}

std::vector<torch::Tensor> clone_all(const std::vector<torch::Tensor>& ps) {
  std::vector<torch::Tensor> out;
  for (const auto& p : ps)
    out.push_back(p.detach().clone());
  return out;
}

// Plain libtorch SGD on the union batch, from the weights of make_model(1).
std::vector<torch::Tensor> reference_weights(int shards) {
  auto model = make_model(1);
  const Data data = make_data(shards);
  for (int s = 0; s < kSteps; ++s) {
    model->zero_grad();
    loss_sum(model, data.x[s], data.y[s]).backward();
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      p.sub_(p.grad() * (kLr / (shards * kShard)));
  }
  return clone_all(model->parameters());
}

// One worker of the job: `devices` replicas with different initial weights
// (init must make them rank 0's replica 0, i.e. make_model(1)), each running
// its shard in its own thread. Returns every replica's final weights.
// pack: the default packing (this model's four parameters are all small: one
// key); otherwise one key per parameter.
std::vector<std::vector<torch::Tensor>> run_worker(KVStore& kv, int devices, int shards,
                                                   bool update_on_kvstore, bool pack) {
  const int rank = kv.rank();
  std::vector<torch::nn::Sequential> models;
  std::vector<pushpull::torch::ParameterList> params;
  for (int d = 0; d < devices; ++d) {
    models.push_back(make_model(rank == 0 && d == 0 ? 1 : 100 + rank * devices + d));
    params.push_back(models.back()->parameters());
  }
  const Data data = make_data(shards);
  TrainerOptions options{.update_on_kvstore = update_on_kvstore};
  if (!pack) options.fuse_below = 0;
  Trainer trainer(params, OptimizerSpec::parse("sgd:learning_rate=" + std::to_string(kLr)), kv,
                  options);
  if (trainer.keys().size() != (pack ? 1 : params[0].size()))
    throw pushpull::InvalidArgument("unexpected keys: " + std::to_string(trainer.keys().size()));
  trainer.init();
  ReplicaRunner runner(devices);
  for (int s = 0; s < kSteps; ++s) {
    runner.run([&](int d) {
      const int64_t shard = rank * devices + d;
      auto x = data.x[s].narrow(0, shard * kShard, kShard);
      auto y = data.y[s].narrow(0, shard * kShard, kShard);
      loss_sum(models[d], x, y).backward();
    });
    trainer.step(int64_t{kShard} * devices);
    for (auto& m : models)
      m->zero_grad();
  }
  std::vector<std::vector<torch::Tensor>> out;
  for (auto& m : models)
    out.push_back(clone_all(m->parameters()));
  return out;
}

// max |a - ref| <= 1e-5 * max |ref|, per tensor.
void expect_close(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& ref,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), ref[i].sizes()) << what << " parameter " << i;
    const double err = (got[i] - ref[i]).abs().max().item<double>();
    const double scale = ref[i].abs().max().item<double>();
    EXPECT_LE(err, 1e-5 * scale) << what << " parameter " << i << ": max error " << err
                                 << " for values up to " << scale;
  }
}

void write_weights(const std::string& path, const std::vector<torch::Tensor>& ws) {
  std::ofstream f(path, std::ios::binary);
  for (const auto& w : ws)
    f.write(static_cast<const char*>(w.data_ptr()), w.nbytes());
  if (!f) throw pushpull::IoError("cannot write " + path);
}

std::vector<torch::Tensor> read_weights(const std::string& path,
                                        const std::vector<torch::Tensor>& like) {
  std::ifstream f(path, std::ios::binary);
  std::vector<torch::Tensor> out;
  for (const auto& l : like) {
    auto t = torch::empty_like(l);
    f.read(static_cast<char*>(t.data_ptr()), t.nbytes());
    out.push_back(t);
  }
  if (!f) ADD_FAILURE() << "cannot read " << path;
  return out;
}

// ---- Equivalence, parametrised by store type and process setup ----

enum class Procs {
  kOneStore,  // one store in this process; the workers are its devices
  kChild,     // one worker: this binary as a child process
  kLaunched,  // `pushpull launch -n W -s S` running this binary as workers
};

struct EqSetup {
  const char* kvstore;
  Procs procs;
  int workers;
  int devices;
  bool update_on_kvstore;
  bool pack = true;  // TrainerOptions' default packing, else fuse_below = 0
};

std::string setup_name(const testing::TestParamInfo<EqSetup>& info) {
  const EqSetup& s = info.param;
  const char* p = s.procs == Procs::kOneStore ? "one_store"
                  : s.procs == Procs::kChild  ? "child"
                                              : "launched";
  return std::string(s.kvstore) + "_" + p + "_" + std::to_string(s.workers) + "x" +
         std::to_string(s.devices) + (s.update_on_kvstore ? "_store_update" : "_local_update") +
         (s.pack ? "" : "_unpacked");
}

class Equivalence : public testing::TestWithParam<EqSetup> {};

TEST_P(Equivalence, MatchesOneProcessOnTheUnionBatch) {
  const EqSetup s = GetParam();
  const int shards = s.workers * s.devices;
  const auto ref = reference_weights(shards);
  if (s.procs == Procs::kOneStore) {
    ASSERT_EQ(s.workers, 1) << "one store holds one worker";
    auto kv = pushpull::create_kvstore(s.kvstore);
    auto replicas = run_worker(*kv, s.devices, shards, s.update_on_kvstore, s.pack);
    for (size_t d = 0; d < replicas.size(); ++d) {
      expect_close(replicas[d], ref, "replica " + std::to_string(d));
    }
    return;
  }
  const auto dir =
      std::filesystem::temp_directory_path() / ("pp_torch_eq_" + std::to_string(::getpid()) + "_" +
                                                setup_name(testing::TestParamInfo<EqSetup>(s, 0)));
  std::filesystem::create_directories(dir);
  std::vector<std::string> worker = {std::filesystem::read_symlink("/proc/self/exe").string(),
                                     "--equivalence-worker",
                                     "--kvstore",
                                     s.kvstore,
                                     "--devices",
                                     std::to_string(s.devices),
                                     "--shards",
                                     std::to_string(shards),
                                     "--update-on-kvstore",
                                     s.update_on_kvstore ? "1" : "0",
                                     "--pack",
                                     s.pack ? "1" : "0",
                                     "--out-dir",
                                     dir.string()};
  std::vector<std::string> argv;
  if (s.procs == Procs::kLaunched) {
    argv = {std::string(PUSHPULL_BIN_DIR) + "/pushpull",
            "launch",
            "-n",
            std::to_string(s.workers),
            "-s",
            "1",
            "--timeout",
            "120",
            "--"};
  }
  argv.insert(argv.end(), worker.begin(), worker.end());
  pushpull::test::ChildProcess child(argv);
  auto rc = child.wait(std::chrono::seconds(180));
  ASSERT_TRUE(rc.has_value()) << "workers did not finish in 180 s:\n" << child.output();
  ASSERT_EQ(*rc, 0) << child.output();
  for (int r = 0; r < s.workers; ++r) {
    expect_close(read_weights((dir / ("rank" + std::to_string(r) + ".bin")).string(), ref), ref,
                 "worker " + std::to_string(r));
  }
  std::filesystem::remove_all(dir);
}

// dist_async is not equivalent by design (no sync rounds).
INSTANTIATE_TEST_SUITE_P(
    Setups, Equivalence,
    testing::Values(EqSetup{"local", Procs::kOneStore, 1, 1, true},
                    EqSetup{"local", Procs::kOneStore, 1, 2, true},
                    EqSetup{"local", Procs::kOneStore, 1, 4, true},
                    EqSetup{"local", Procs::kOneStore, 1, 3, false},
                    EqSetup{"device", Procs::kOneStore, 1, 2, false},
                    EqSetup{"local", Procs::kChild, 1, 2, true},
                    EqSetup{"dist_sync", Procs::kLaunched, 2, 1, true},
                    EqSetup{"dist_sync", Procs::kLaunched, 3, 1, false},
                    EqSetup{"dist_sync", Procs::kLaunched, 2, 2, true},
                    EqSetup{"dist_device_sync", Procs::kLaunched, 2, 2, false},
                    EqSetup{"dist_sync_allreduce", Procs::kLaunched, 2, 1, false},
                    EqSetup{"dist_sync_allreduce", Procs::kLaunched, 3, 1, true},
                    EqSetup{"local", Procs::kOneStore, 1, 2, true, false},
                    EqSetup{"local", Procs::kOneStore, 1, 3, false, false},
                    EqSetup{"dist_sync", Procs::kLaunched, 2, 2, true, false},
                    EqSetup{"dist_sync", Procs::kLaunched, 3, 1, false, false}),
    setup_name);

// The equivalence worker: trains like run_worker and writes replica 0's
// weights to <out-dir>/rank<R>.bin (after checking all replicas agree).
int equivalence_worker(int argc, char** argv) {
  CLI::App app("torch_trainer_test equivalence worker");
  std::string type = "local", out_dir;
  int devices = 1, shards = 1;
  bool update_on_kvstore = true, pack = true, unused = false;
  app.add_flag("--equivalence-worker", unused);
  app.add_option("--kvstore", type);
  app.add_option("--devices", devices);
  app.add_option("--shards", shards);
  app.add_option("--update-on-kvstore", update_on_kvstore);
  app.add_option("--pack", pack);
  app.add_option("--out-dir", out_dir)->required();
  CLI11_PARSE(app, argc, argv);
  try {
    auto kv = pushpull::create_kvstore(type, pushpull::Options::from_env());
    auto replicas = run_worker(*kv, devices, shards, update_on_kvstore, pack);
    for (size_t d = 1; d < replicas.size(); ++d) {
      for (size_t i = 0; i < replicas[0].size(); ++i) {
        if (!torch::equal(replicas[d][i], replicas[0][i])) {
          std::fprintf(stderr, "replica %zu differs from replica 0 in parameter %zu\n", d, i);
          return 1;
        }
      }
    }
    write_weights(out_dir + "/rank" + std::to_string(kv->rank()) + ".bin", replicas[0]);
    kv->barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "equivalence worker failed: %s\n", e.what());
    return 1;
  }
  return 0;
}

// ---- Hooks, stats, init ----

template <typename F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no InvalidArgument (expected one mentioning '" << needle << "')";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Trainer, InitMakesEveryReplicaStartFromReplicaZero) {
  auto kv = pushpull::create_kvstore("local");
  auto m0 = make_model(1), m1 = make_model(2);
  const auto w0 = clone_all(m0->parameters());
  ASSERT_FALSE(torch::equal(m1->parameters()[0], w0[0]));
  Trainer trainer(Replicas{m0->parameters(), m1->parameters()}, OptimizerSpec::parse("sgd"), *kv);
  trainer.init();
  trainer.init();  // idempotent
  expect_close(clone_all(m1->parameters()), w0, "replica 1");
  EXPECT_EQ(trainer.num_devices(), 2);
  EXPECT_EQ(trainer.num_parameters(), w0.size());
}

// Parameters of 40, 40, 4000 and 40 bytes, packing below 4000: the small ones
// go in order into keys of their first parameter; an exact SGD step either way.
TEST(Trainer, PacksSmallParametersInOrderUnderTheirFirstKey) {
  auto make_params = [] {
    std::vector<torch::Tensor> ps;
    for (int64_t numel : {10, 10, 1000, 10})
      ps.push_back(torch::arange(numel, torch::kFloat).requires_grad_());
    return ps;
  };
  auto keys_of = [&](TrainerOptions o) {
    auto kv = pushpull::create_kvstore("local");
    Trainer t(Replicas{make_params()}, OptimizerSpec::parse("sgd"), *kv, o);
    std::vector<int64_t> ks;
    for (const auto& k : t.keys())
      ks.push_back(k.as_int());
    return ks;
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(keys_of({.fuse_below = 4000}), (V{0, 2}));
  EXPECT_EQ(keys_of({.fuse_below = 4000, .bucket_bytes = 80}), (V{0, 2, 3}));
  EXPECT_EQ(keys_of({.fuse_below = 0}), (V{0, 1, 2, 3}));
  EXPECT_EQ(keys_of({.key_base = 10, .fuse_below = 4000}), (V{10, 12}));
  EXPECT_EQ(keys_of({}), (V{0}));  // all under the 256 KiB default, one 1 MiB bucket

  for (bool on_store : {true, false}) {
    auto kv = pushpull::create_kvstore("local");
    auto ps = make_params();
    Trainer trainer(Replicas{ps}, OptimizerSpec::parse("sgd:learning_rate=0.5"), *kv,
                    {.update_on_kvstore = on_store, .key_base = 10, .fuse_below = 4000});
    for (int step = 0; step < 3; ++step) {  // the first from step(), then from hooks
      torch::Tensor loss = torch::zeros({});
      for (size_t i = 0; i < ps.size(); ++i)
        loss = loss + (ps[i] * static_cast<double>(i + 1)).sum();
      loss.backward();
      trainer.step(2);  // rescale_grad 1/2: each step moves p_i by 0.25 (i + 1)
      for (auto& p : ps)
        p.mutable_grad().zero_();
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      auto want = torch::arange(ps[i].numel(), torch::kFloat) - 3 * 0.25 * double(i + 1);
      EXPECT_TRUE(torch::allclose(ps[i].detach(), want))
          << "parameter " << i << (on_store ? ", store update" : ", local update");
    }
    EXPECT_EQ(trainer.stats().hook_pushes, 2 * 2);  // 2 keys, steps 2 and 3
  }
  auto kv = pushpull::create_kvstore("local");
  expect_invalid(
      [&] {
        Trainer(Replicas{make_params()}, OptimizerSpec::parse("sgd"), *kv,
                TrainerOptions{.fuse_below = -1});
      },
      "fuse_below");
}

TEST(Trainer, PushesFromHooksAfterTheFirstStep) {
  auto kv = pushpull::create_kvstore("local");
  auto m = make_model(1);
  Trainer trainer(m->parameters(), OptimizerSpec::parse("sgd:learning_rate=0.1"), *kv);
  const Data data = make_data(1);
  for (int s = 0; s < 3; ++s) {
    loss_sum(m, data.x[s], data.y[s]).backward();
    trainer.step(kShard);
    m->zero_grad();
  }
  const auto st = trainer.stats();
  const auto n = static_cast<int64_t>(trainer.keys().size());
  EXPECT_EQ(n, 1);  // the model's four small parameters, packed
  EXPECT_EQ(st.steps, 3);
  EXPECT_EQ(st.step_pushes, n);      // the first step (the store's optimizer is set there)
  EXPECT_EQ(st.hook_pushes, 2 * n);  // then every key as soon as its gradients were ready
  EXPECT_GE(st.wait_seconds, 0.0);
}

TEST(Trainer, SecondBackwardBeforeStepIsAnError) {
  auto kv = pushpull::create_kvstore("local");
  auto m = make_model(1);
  Trainer trainer(m->parameters(), OptimizerSpec::parse("sgd"), *kv);
  const Data data = make_data(1);
  loss_sum(m, data.x[0], data.y[0]).backward();
  trainer.step(kShard);
  loss_sum(m, data.x[1], data.y[1]).backward();
  try {
    loss_sum(m, data.x[2], data.y[2]).backward();
    FAIL() << "a second backward before step() was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("push_from_hooks"), std::string::npos) << e.what();
  }
}

TEST(Trainer, AccumulatesOverSeveralBackwardsWithoutHooks) {
  // Two half batches accumulated then one step == one step on the whole batch.
  const auto ref = reference_weights(2);
  auto kv = pushpull::create_kvstore("local");
  auto m = make_model(1);
  Trainer trainer(Replicas{m->parameters()}, OptimizerSpec::parse("sgd:learning_rate=0.5"), *kv,
                  TrainerOptions{.update_on_kvstore = false, .push_from_hooks = false});
  const Data data = make_data(2);
  for (int s = 0; s < kSteps; ++s) {
    for (int h = 0; h < 2; ++h) {
      loss_sum(m, data.x[s].narrow(0, h * kShard, kShard), data.y[s].narrow(0, h * kShard, kShard))
          .backward();
    }
    trainer.step(2 * kShard);
    m->zero_grad();
  }
  expect_close(clone_all(m->parameters()), ref, "accumulated");
}

// ---- Error cases ----

TEST(TrainerErrors, RejectsBadParameters) {
  auto kv = pushpull::create_kvstore("local");
  auto sgd = OptimizerSpec::parse("sgd");
  auto make = [&](torch::Tensor t) { Trainer(std::vector<torch::Tensor>{t}, sgd, *kv); };
  expect_invalid([&] { make(torch::zeros({3}, torch::kDouble).requires_grad_()); }, "float32");
  expect_invalid([&] { make(torch::zeros({3, 4}).t().requires_grad_()); }, "not contiguous");
  expect_invalid([&] { make(torch::zeros({3})); }, "requires grad");
  expect_invalid([&] { make(torch::Tensor()); }, "undefined");
  expect_invalid([&] { Trainer(std::vector<torch::Tensor>{}, sgd, *kv); }, "no parameters");
  auto a = torch::zeros({3}).requires_grad_();
  expect_invalid([&] { Trainer(Replicas{{a}, {a}}, sgd, *kv); }, "shares its memory");
  auto b = torch::zeros({4}).requires_grad_();
  expect_invalid([&] { Trainer(Replicas{{a}, {b}}, sgd, *kv); }, "same shapes");
  expect_invalid([&] { Trainer(Replicas{{a}, {}}, sgd, *kv); }, "replica 1 has 0 parameters");
  expect_invalid(
      [&] { Trainer(std::vector<torch::Tensor>{a}, OptimizerSpec::parse("sgd:nonsense=1"), *kv); },
      "nonsense");
}

TEST(TrainerErrors, RejectsMissingAndBadGradients) {
  auto kv = pushpull::create_kvstore("local");
  auto used = torch::ones({2}).requires_grad_();
  auto unused = torch::ones({2}).requires_grad_();
  Trainer trainer(std::vector<torch::Tensor>{used, unused}, OptimizerSpec::parse("sgd"), *kv);
  (used * 3).sum().backward();
  expect_invalid([&] { trainer.step(1); }, "parameter 1 (packed in key 0) of replica 0");
  expect_invalid([&] { trainer.step(0); }, "batch_size");
  unused.mutable_grad() = torch::zeros({2}, torch::kDouble);
  expect_invalid([&] { trainer.step(1); }, "float32");
  unused.mutable_grad() = torch::zeros({4, 2}).t().narrow(0, 0, 1).squeeze(0);
  expect_invalid([&] { trainer.step(1); }, "gradient of parameter 1");
  // A good step still works after the errors, and nothing was lost.
  unused.mutable_grad() = torch::zeros({2});
  trainer.step(1);
  EXPECT_TRUE(torch::allclose(used.detach(), torch::full({2}, 1.0 - 0.01 * 3)));
}

// ---- Multi-device helpers ----

TEST(ReplicaRunner, RunsEveryDeviceAndRethrows) {
  ReplicaRunner runner(3);
  std::vector<int> hits(3, 0);
  for (int r = 0; r < 5; ++r)
    runner.run([&](int d) { ++hits[d]; });
  EXPECT_EQ(hits, (std::vector<int>{5, 5, 5}));
  EXPECT_THROW(runner.run([](int d) {
    if (d == 2) throw InvalidArgument("device 2 failed");
  }),
               InvalidArgument);
  runner.run([&](int d) { ++hits[d]; });  // still usable
  EXPECT_EQ(hits[2], 6);
  EXPECT_THROW(ReplicaRunner(0), InvalidArgument);
}

TEST(ReplicaRunner, BatchSlicesCoverTheBatch) {
  for (int64_t batch : {1, 7, 64, 65}) {
    for (int k : {1, 2, 3, 4}) {
      int64_t next = 0;
      for (int d = 0; d < k; ++d) {
        auto [b, e] = pushpull::torch::batch_slice(batch, k, d);
        EXPECT_EQ(b, next);
        EXPECT_LE(e - b, batch / k + 1);
        EXPECT_GE(e - b, batch / k);
        next = e;
      }
      EXPECT_EQ(next, batch);
    }
  }
  EXPECT_THROW(pushpull::torch::batch_slice(8, 2, 2), InvalidArgument);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--equivalence-worker") return equivalence_worker(argc, argv);
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
