// SPDX-License-Identifier: Apache-2.0
// Tests of pushpull::torch::Trainer and the multi-device helpers.
//
// Equivalence: W workers x D devices, each device taking a shard of b samples,
// end k SGD steps with the same weights as one plain libtorch process taking
// the union batch of W*D*b samples. The setups run the workers in one store,
// in a child process (this binary in --equivalence-worker mode, so the
// multi-process plumbing is exercised), and later through `pushpull launch`.
// Hooks, statistics, init, error cases and the multi-device helpers:
// trainer_unit_tests.cpp.
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
#include "trainer_fixture.h"

namespace {

using namespace trainer_test;

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

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--equivalence-worker") return equivalence_worker(argc, argv);
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
