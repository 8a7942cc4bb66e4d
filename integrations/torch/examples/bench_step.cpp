// SPDX-License-Identifier: Apache-2.0
// One worker of `pushpull bench step --impls cpp`: the synthetic training
// step of python/pushpull/bench_step.py (the same model: --layers square
// linear layers with biases holding --grad-mb MiB of float32 parameters, a
// random batch of --batch rows, one torch thread, SGD), written against
// libtorch and pushpull::torch::DistributedOptimizer (gradients are
// allreduced from backward hooks while backward runs, the step waits for
// them). Rank 0 prints `result cpp <median step ms>`.
//
//   pushpull launch -n 2 -s 0 -- build/bin/pp_torch_step --grad-mb 64
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "pushpull/collective.h"
#include "pushpull/options.h"
#include "pushpull/torch/distributed_optimizer.h"

int main(int argc, char** argv) {
  double grad_mb = 64;
  int layers = 8, batch = 4, steps = 15, warmup = 3;
  CLI::App app{"pushpull bench step, the libtorch DistributedOptimizer worker"};
  app.add_option("--grad-mb", grad_mb, "MiB of float32 parameters")->check(CLI::PositiveNumber);
  app.add_option("--layers", layers, "Linear layers")->check(CLI::Range(1, 1000));
  app.add_option("--batch", batch, "Rows per batch")->check(CLI::Range(1, 1 << 20));
  app.add_option("--steps", steps, "Timed steps")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "Untimed steps first")->check(CLI::Range(0, 1000));
  CLI11_PARSE(app, argc, argv);

  torch::set_num_threads(1);
  pushpull::collective::init(pushpull::Options::from_env());
  // d*d + d floats per layer, `layers` of them, add up to grad_mb MiB.
  const double floats = grad_mb * (1 << 20) / 4 / layers;
  const int64_t d = std::max<int64_t>(1, static_cast<int64_t>(std::sqrt(floats)));
  torch::manual_seed(1234);  // the same initial weights on every rank
  torch::nn::Sequential model;
  for (int i = 0; i < layers; ++i)
    model->push_back(torch::nn::Linear(d, d));
  torch::Tensor x = torch::randn({batch, d});
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1e-4));
  {
    pushpull::torch::DistributedOptimizer opt(sgd,
                                              pushpull::torch::named(model->named_parameters()));
    std::vector<double> ms;
    for (int i = 0; i < warmup + steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      opt.zero_grad();
      model->forward(x).sum().backward();
      opt.step();
      const auto t1 = std::chrono::steady_clock::now();
      if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const size_t n = ms.size();
    const double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
    if (pushpull::collective::rank() == 0) {
      std::printf("result cpp %.4f\n", median);
      std::fflush(stdout);
    }
  }
  pushpull::collective::shutdown();
  return 0;
}
