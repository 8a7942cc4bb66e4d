// SPDX-License-Identifier: Apache-2.0
// The worker mode of torch_distributed_optimizer_test (--dopt-worker, run by
// `pushpull launch -s 0` from distributed_optimizer_tests.cpp): the
// equivalence scenario (DistributedOptimizer steps on this rank's shard) and
// the state scenario (broadcast_parameters and broadcast_optimizer_state
// from a root whose optimizer differs), each writing its tensors for the
// test to compare.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "dopt_fixture.h"
#include "pushpull/collective.h"
#include "pushpull/torch/distributed_optimizer.h"

namespace {

using namespace dopt_test;

// The optimizer's state as flat tensors, in parameter order: SGD's momentum
// buffers; Adam's step, exp_avg, exp_avg_sq; then every group's lr.
std::vector<torch::Tensor> optimizer_state(torch::optim::Optimizer& opt) {
  std::vector<torch::Tensor> out;
  for (auto& g : opt.param_groups()) {
    for (auto& p : g.params()) {
      auto it = opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (it == opt.state().end()) {
        out.push_back(torch::zeros({0}));
        continue;
      }
      if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
        out.push_back(s->momentum_buffer().flatten());
      } else if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
        out.push_back(torch::full({1}, static_cast<double>(a->step())));
        out.push_back(a->exp_avg().flatten());
        out.push_back(a->exp_avg_sq().flatten());
      }
    }
    out.push_back(torch::full({1}, g.options().get_lr()));
  }
  return out;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                        torch::nn::Sequential& m, double lr) {
  if (kind == "adam") {
    return std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(lr));
  }
  return std::make_unique<torch::optim::SGD>(m->parameters(),
                                             torch::optim::SGDOptions(lr).momentum(0.9));
}

// ---- The worker (this binary under `pushpull launch -s 0`) ----

struct WorkerArgs {
  std::string scenario, out_dir, optimizer = "sgd";
  int passes = 1;
  double momentum = 0;
  int root = 0;
  bool fp16 = false;             // Compression::kFp16
  std::vector<int> process_set;  // empty: every rank
  double predivide = 1.0;        // gradient_predivide_factor
  int num_groups = 0;            // groups started together
};

// Different initial weights per rank, made rank 0's by broadcast_parameters,
// then kSteps DistributedOptimizer steps on this rank's shard.
void equivalence_worker(const WorkerArgs& a, Session& session) {
  Communicator& comm = session.communicator();
  const int rank = comm.rank(), n = comm.size();
  auto model = make_model(rank == 0 ? 1 : 100 + rank);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(kLr).momentum(a.momentum));
  DistributedOptimizer opt(sgd, named(model->named_parameters()), comm,
                           {.backward_passes_per_step = a.passes,
                            .average_aggregated_gradients = a.passes > 1,
                            .compression = a.fp16 ? pushpull::torch::Compression::kFp16
                                                  : pushpull::torch::Compression::kNone,
                            .process_set = a.process_set,
                            .gradient_predivide_factor = a.predivide,
                            .num_groups = a.num_groups});
  broadcast_parameters(named(model->named_parameters()), 0, comm);
  broadcast_optimizer_state(sgd, 0, comm);
  const Data data = make_data(n);
  const int micro = kShard / a.passes;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    for (int p = 0; p < a.passes; ++p) {
      const int64_t begin = rank * kShard + p * micro;
      loss_mean(model, data.x[s].narrow(0, begin, micro), data.y[s].narrow(0, begin, micro))
          .backward();
    }
    opt.step();
  }
  const auto st = opt.stats();
  const bool member = a.process_set.empty() || std::find(a.process_set.begin(), a.process_set.end(),
                                                         rank) != a.process_set.end();
  const int64_t reductions = member ? kSteps * static_cast<int64_t>(opt.num_parameters()) : 0;
  if (st.steps != kSteps || st.hook_allreduces + st.sync_allreduces != reductions) {
    throw pushpull::Internal("unexpected statistics");
  }
  write_tensors(a.out_dir + "/rank" + std::to_string(rank) + ".bin", model->parameters());
}

// Rank r takes r local steps (rank 0 none: no state at all) with its own
// learning rate, so every rank's optimizer differs; then both broadcasts from
// `root`, then one DistributedOptimizer step on every rank.
void state_worker(const WorkerArgs& a, Session& session) {
  Communicator& comm = session.communicator();
  const int rank = comm.rank(), n = comm.size();
  auto model = make_model(100 + rank);
  auto opt = make_optimizer(a.optimizer, model, 0.01 * (rank + 1));
  const Data data = make_data(n);
  for (int s = 0; s < rank; ++s) {
    opt->zero_grad();
    loss_mean(model, data.x[s], data.y[s]).backward();
    opt->step();
  }
  const std::string base = a.out_dir + "/rank" + std::to_string(rank);
  write_tensors(base + ".before", optimizer_state(*opt));
  broadcast_parameters(named(model->named_parameters()), a.root, comm);
  broadcast_optimizer_state(*opt, a.root, comm);
  write_tensors(base + ".after", optimizer_state(*opt));
  DistributedOptimizer dopt(*opt, named(model->named_parameters()), comm);
  dopt.zero_grad();
  loss_mean(model, data.x[0].narrow(0, rank * kShard, kShard),
            data.y[0].narrow(0, rank * kShard, kShard))
      .backward();
  dopt.step();
  write_tensors(base + ".weights", model->parameters());
}

}  // namespace

namespace dopt_test {

int dopt_worker(int argc, char** argv) {
  CLI::App app("torch_distributed_optimizer_test worker");
  WorkerArgs a;
  bool unused = false;
  app.add_flag("--dopt-worker", unused);
  app.add_option("--scenario", a.scenario)->required();
  app.add_option("--out-dir", a.out_dir)->required();
  app.add_option("--passes", a.passes);
  app.add_option("--momentum", a.momentum);
  app.add_option("--optimizer", a.optimizer);
  app.add_option("--root", a.root);
  app.add_flag("--fp16", a.fp16);
  app.add_option("--process-set", a.process_set)->delimiter(',');
  app.add_option("--predivide", a.predivide);
  app.add_option("--num-groups", a.num_groups);
  CLI11_PARSE(app, argc, argv);
  try {
    torch::set_num_threads(1);
    Session session(pushpull::Options::from_env());
    if (a.scenario == "equivalence") {
      equivalence_worker(a, session);
    } else {
      state_worker(a, session);
    }
    session.communicator().barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt worker failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
}  // namespace dopt_test
