// SPDX-License-Identifier: Apache-2.0
// The reference job: LeNet on Fashion-MNIST, data parallel through a KVStore
// (MXNet's distributed training tutorial, in libtorch C++).
//
//   lenet --kvstore local --devices-per-worker 2 --epochs 2
//   pushpull launch -n 2 -s 2 -- build/bin/lenet --kvstore dist_sync --threads 1
//   pushpull launch -n 2 -s 0 -- build/bin/lenet --mode horovod --threads 1
//
// Each worker reads its part of the training set (SplitSampler: num_parts =
// workers, part_index = rank), splits every batch across its device replicas
// (threads), and synchronises through pushpull::torch::Trainer (--mode
// kvstore) or, with one device, through torch::optim::SGD wrapped in
// pushpull::torch::DistributedOptimizer over the collectives (--mode
// horovod). See docs/training.md.
#include <torch/torch.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "pushpull/data/idx.h"
#include "pushpull/data/sampler.h"
#include "pushpull/error.h"
#include "pushpull/kvstore.h"
#include "pushpull/options.h"
#include "pushpull/torch/distributed_optimizer.h"
#include "pushpull/torch/elastic.h"
#include "pushpull/torch/replicas.h"
#include "pushpull/torch/trainer.h"

namespace {

namespace F = torch::nn::functional;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string kvstore = "local";
  int devices = 1;
  int epochs = 2;
  int batch_size = 64;  // per worker
  double lr = 0.05;
  double momentum = 0.9;
  double wd = 0.0;
  uint64_t seed = 42;
  std::string data_dir = pushpull::data::kFashionMnistDir;
  bool update_on_kvstore = true;
  // Parameters under this many bytes share flat keys (TrainerOptions).
  int64_t fuse_below = pushpull::torch::TrainerOptions{}.fuse_below;
  int64_t max_batches = 0;  // per epoch; 0 = all
  int64_t test_limit = 0;   // test images evaluated; 0 = all
  int log_every = 200;
  int threads = 0;
  std::string model = "mxnet";
  std::string mode = "kvstore";       // or "horovod"
  std::string compression = "none";   // gradient compression type (docs/kvstore.md)
  std::string compression_threshold;  // for 1bit / 2bit; empty: the default
  bool elastic = false;               // --mode horovod under `pushpull launch --min-workers ...`
  int commit_every = 20;              // --elastic: steps between commits
};

// conv 5x5 -> relu -> pool 2 -> conv 5x5 -> relu -> pool 2 -> dense -> relu -> dense 10.
// "mxnet": 20 and 50 filters, 500 hidden (the MXNet tutorial); "small": 6, 16, 120.
struct LeNetImpl : torch::nn::Module {
  LeNetImpl(int64_t c1, int64_t c2, int64_t hidden)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, c1, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(c1, c2, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(c2 * 4 * 4, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = F::max_pool2d(torch::relu(conv1->forward(x)), F::MaxPool2dFuncOptions(2));
    x = F::max_pool2d(torch::relu(conv2->forward(x)), F::MaxPool2dFuncOptions(2));
    x = torch::relu(fc1->forward(x.flatten(1)));
    return fc2->forward(x);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(LeNet);

LeNet make_lenet(const std::string& model) {
  if (model == "mxnet") return LeNet(20, 50, 500);
  if (model == "small") return LeNet(6, 16, 120);
  throw pushpull::InvalidArgument("--model " + model + ": use mxnet or small");
}

// Images normalised with Fashion-MNIST's mean and deviation, labels as int64.
struct Split {
  torch::Tensor x, y;
  int64_t size() const { return x.size(0); }
};
Split load_split(const std::string& dir, const std::string& prefix) {
  auto ds = pushpull::data::load_mnist(dir, prefix);
  const auto n = static_cast<int64_t>(ds.count);
  const auto rows = static_cast<int64_t>(ds.rows), cols = static_cast<int64_t>(ds.cols);
  Split s;
  s.x = (torch::from_blob(ds.images.data(), {n, 1, rows, cols}, torch::kFloat32) - 0.2860) / 0.3530;
  s.y = torch::from_blob(ds.labels.data(), {n}, torch::kUInt8).to(torch::kInt64);
  return s;
}

// Accuracy of `model` on the first `limit` test images, split across devices.
double test_accuracy(std::vector<LeNet>& models, pushpull::torch::ReplicaRunner& runner,
                     const Split& test, int64_t limit) {
  torch::NoGradGuard no_grad;
  const int64_t n = limit > 0 ? std::min(limit, test.size()) : test.size();
  std::vector<int64_t> correct(models.size(), 0);
  runner.run([&](int d) {
    auto [begin, end] = pushpull::torch::batch_slice(n, runner.num_devices(), d);
    models[d]->eval();
    for (int64_t b = begin; b < end; b += 1000) {
      const int64_t len = std::min<int64_t>(1000, end - b);
      auto pred = models[d]->forward(test.x.narrow(0, b, len)).argmax(1);
      correct[d] += pred.eq(test.y.narrow(0, b, len)).sum().item<int64_t>();
    }
    models[d]->train();
  });
  int64_t total = 0;
  for (auto c : correct)
    total += c;
  return static_cast<double>(total) / static_cast<double>(n);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int run(const Args& a) {
  const auto wall0 = Clock::now();
  const bool horovod = a.mode == "horovod";
  if (!horovod && a.mode != "kvstore") {
    throw pushpull::InvalidArgument("--mode " + a.mode + ": use kvstore or horovod");
  }
  if (horovod && a.compression != "none" && a.compression != "fp16" && a.compression != "2bit" &&
      a.compression != "1bit") {
    throw pushpull::InvalidArgument("--mode horovod: --compression " + a.compression +
                                    ": use none, fp16, 2bit or 1bit");
  }
  if (horovod && a.devices != 1) {
    throw pushpull::InvalidArgument(
        "--mode horovod runs one device per process (as Horovod): use --devices-per-worker 1 "
        "and more processes (pushpull launch -n N -s 0)");
  }
  // One of the two: a KVStore (+ Trainer below) or a collectives Session.
  std::unique_ptr<pushpull::KVStore> kv;
  std::unique_ptr<pushpull::collective::Session> session;
  if (horovod) {
    session = std::make_unique<pushpull::collective::Session>(pushpull::Options::from_env());
  } else {
    kv = pushpull::create_kvstore(a.kvstore, pushpull::Options::from_env());
    std::map<std::string, std::string> compression{{"type", a.compression}};
    if (!a.compression_threshold.empty()) compression["threshold"] = a.compression_threshold;
    kv->set_gradient_compression(compression);  // before the first push
  }
  const int rank = horovod ? session->rank() : kv->rank();
  const int workers = horovod ? session->size() : kv->num_workers();
  const std::string sync = horovod ? "horovod" : a.kvstore;
  // `pushpull launch` (local and ssh) already starts every line with
  // "[worker N] "; under mpirun, srun or on its own the program says who it is.
  const bool launcher_prefixes = std::getenv("PUSHPULL_JOB_ID") != nullptr &&
                                 std::getenv("OMPI_COMM_WORLD_RANK") == nullptr &&
                                 std::getenv("SLURM_PROCID") == nullptr;
  const std::string who = launcher_prefixes ? "" : fmt::format("[worker {}/{}] ", rank, workers);
  if (a.kvstore.starts_with("dist_async") && !a.update_on_kvstore) {
    throw pushpull::InvalidArgument(
        "--kvstore dist_async needs the optimizer on the store: drop --update-on-kvstore false");
  }
  if (a.devices < 1 || a.batch_size < a.devices || a.epochs < 1) {
    throw pushpull::InvalidArgument(
        "need --devices-per-worker >= 1, --batch-size >= --devices-per-worker, --epochs >= 1");
  }
  const int threads = pushpull::torch::configure_torch_threads(a.devices, a.threads);

  const Split train = load_split(a.data_dir, "train");
  const Split test = load_split(a.data_dir, "t10k");
  pushpull::data::SplitSampler sampler(static_cast<size_t>(train.size()),
                                       static_cast<size_t>(workers), static_cast<size_t>(rank),
                                       a.seed);
  // Whole batches only: every worker runs the same number of sync rounds and
  // the store's rescale_grad (1 / global batch) stays right.
  int64_t batches = static_cast<int64_t>(sampler.size()) / a.batch_size;
  if (a.max_batches > 0) batches = std::min(batches, a.max_batches);

  std::vector<LeNet> models;
  std::vector<pushpull::torch::ParameterList> params;
  for (int d = 0; d < a.devices; ++d) {
    torch::manual_seed(a.seed);
    models.push_back(make_lenet(a.model));
    params.push_back(models.back()->parameters());
  }
  std::unique_ptr<pushpull::torch::Trainer> trainer;
  std::unique_ptr<torch::optim::SGD> sgd;
  std::unique_ptr<pushpull::torch::DistributedOptimizer> dopt;
  if (horovod) {
    // Horovod's recipe: wrap the optimizer, then start every rank from rank 0's
    // weights and optimizer state.
    auto& comm = session->communicator();
    sgd = std::make_unique<torch::optim::SGD>(
        models[0]->parameters(),
        torch::optim::SGDOptions(a.lr).momentum(a.momentum).weight_decay(a.wd));
    using pushpull::torch::Compression;
    pushpull::torch::DistributedOptimizerOptions dopt_options;
    dopt_options.compression = a.compression == "fp16"   ? Compression::kFp16
                               : a.compression == "2bit" ? Compression::kTwoBit
                               : a.compression == "1bit" ? Compression::kOneBit
                                                         : Compression::kNone;
    if (!a.compression_threshold.empty()) {
      // The optimizer refuses thresholds its codec cannot use; here only
      // what is not a number at all.
      size_t used = 0;
      try {
        dopt_options.compression_threshold = std::stof(a.compression_threshold, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != a.compression_threshold.size())
        throw pushpull::InvalidArgument("--compression-threshold " + a.compression_threshold +
                                        " is not a number");
    }
    dopt = std::make_unique<pushpull::torch::DistributedOptimizer>(
        *sgd, pushpull::torch::named(models[0]->named_parameters()), comm, dopt_options);
    pushpull::torch::broadcast_parameters(pushpull::torch::named(models[0]->named_parameters()), 0,
                                          comm);
    pushpull::torch::broadcast_optimizer_state(*sgd, 0, comm);
  } else {
    const auto spec = pushpull::OptimizerSpec::parse(
        fmt::format("sgd:learning_rate={},momentum={},wd={}", a.lr, a.momentum, a.wd));
    trainer = std::make_unique<pushpull::torch::Trainer>(
        params, spec, *kv,
        pushpull::torch::TrainerOptions{.update_on_kvstore = a.update_on_kvstore,
                                        .fuse_below = a.fuse_below});
    trainer->init();
  }
  auto comm_wait = [&] {
    return horovod ? dopt->stats().wait_seconds : trainer->stats().wait_seconds;
  };
  pushpull::torch::ReplicaRunner runner(a.devices);
  fmt::print(
      "{}worker {} of {}: sync={} devices={} model={} batch={}/worker ({} global) lr={} epochs={} "
      "batches/epoch={} part={} of {} train images, intra-op threads={}\n",
      who, rank, workers, sync, a.devices, a.model, a.batch_size, a.batch_size * workers, a.lr,
      a.epochs, batches, sampler.size(), train.size(), threads);
  std::fflush(stdout);

  double acc = 0, train_seconds = 0;
  int64_t samples_total = 0, steps_total = 0;
  std::vector<double> loss_d(a.devices);
  std::vector<int64_t> correct_d(a.devices);
  for (int epoch = 0; epoch < a.epochs; ++epoch) {
    const auto order = sampler.indices(static_cast<uint64_t>(epoch));
    std::vector<int64_t> order64(order.begin(), order.end());
    auto order_t =
        torch::from_blob(order64.data(), {static_cast<int64_t>(order64.size())}, torch::kInt64);
    const auto t0 = Clock::now();
    auto tw = t0;
    double loss_sum = 0, loss_window = 0;
    int64_t correct = 0, seen = 0, seen_window = 0, correct_window = 0;
    for (int64_t b = 0; b < batches; ++b) {
      auto idx = order_t.narrow(0, b * a.batch_size, a.batch_size);
      auto x = train.x.index_select(0, idx), y = train.y.index_select(0, idx);
      runner.run([&](int d) {
        auto [begin, end] = pushpull::torch::batch_slice(a.batch_size, a.devices, d);
        auto out = models[d]->forward(x.narrow(0, begin, end - begin));
        auto yd = y.narrow(0, begin, end - begin);
        // Trainer: a sum over the samples (it scales by 1 / global batch).
        // DistributedOptimizer: the mean (it averages over the workers).
        auto loss = F::cross_entropy(out, yd, F::CrossEntropyFuncOptions().reduction(torch::kSum));
        if (horovod) {
          (loss / static_cast<double>(end - begin)).backward();
        } else {
          loss.backward();
        }
        loss_d[d] = loss.item<double>();
        correct_d[d] = out.argmax(1).eq(yd).sum().item<int64_t>();
      });
      if (horovod) {
        dopt->step();
        dopt->zero_grad();
      } else {
        trainer->step(a.batch_size);
        for (auto& m : models)
          m->zero_grad();
      }
      ++steps_total;
      for (int d = 0; d < a.devices; ++d) {
        loss_window += loss_d[d];
        correct_window += correct_d[d];
      }
      seen_window += a.batch_size;
      if ((b + 1) % a.log_every == 0 || b + 1 == batches) {
        const double rate = static_cast<double>(seen_window) / seconds_since(tw);
        fmt::print(
            "{}epoch {} batch {}/{} loss {:.4f} train-acc {:.4f} samples/s {:.0f} "
            "(job ~{:.0f})\n",
            who, epoch, b + 1, batches, loss_window / static_cast<double>(seen_window),
            static_cast<double>(correct_window) / static_cast<double>(seen_window), rate,
            rate * workers);
        std::fflush(stdout);
        loss_sum += loss_window;
        correct += correct_window;
        seen += seen_window;
        loss_window = 0;
        correct_window = seen_window = 0;
        tw = Clock::now();
      }
    }
    const double secs = seconds_since(t0);
    train_seconds += secs;
    samples_total += seen;
    acc = test_accuracy(models, runner, test, a.test_limit);
    fmt::print(
        "{}epoch {} done: loss {:.4f} train-acc {:.4f} test-acc {:.4f} time {:.1f}s samples/s "
        "{:.0f} (job ~{:.0f}) comm-wait {:.1f}s\n",
        who, epoch, loss_sum / static_cast<double>(seen),
        static_cast<double>(correct) / static_cast<double>(seen), acc, secs,
        static_cast<double>(seen) / secs, static_cast<double>(seen) / secs * workers, comm_wait());
    std::fflush(stdout);
  }
  if (horovod) {
    session->communicator().barrier();
  } else {
    kv->barrier();
  }
  if (rank == 0) {
    // One machine-readable line (key=value, seconds without units in the
    // comm_wait fields) for bench/scaling.sh.
    const double rate = static_cast<double>(samples_total) / train_seconds;
    const double wait = comm_wait();
    fmt::print(
        "lenet summary: kvstore={} mode={} workers={} devices_per_worker={} epochs={} "
        "test_accuracy={:.4f} wall_time={:.1f}s train_time={:.1f}s samples_per_s_worker={:.0f} "
        "samples_per_s_job={:.0f} steps={} comm_wait_s={:.3f} comm_wait_ms_per_step={:.3f}\n",
        sync, a.mode, workers, a.devices, a.epochs, acc, seconds_since(wall0), train_seconds, rate,
        rate * workers, steps_total, wait,
        steps_total > 0 ? 1000.0 * wait / static_cast<double>(steps_total) : 0.0);
  }
  return 0;
}

// --mode horovod --elastic: Horovod's elastic recipe (docs/elastic.md). The
// state (weights, optimizer, epoch, samples done this epoch over all ranks,
// steps) is committed every --commit-every steps; after a re-formation the
// rest of the epoch's permutation is split among the new ranks. Lines
// "elastic step N size S rank R t=T" and a final "elastic summary: test
// accuracy A ..." (python/tests/elastic_job.py reads them).
int run_elastic(const Args& a) {
  namespace el = pushpull::torch::elastic;
  namespace hvd = pushpull::collective;
  if (a.mode != "horovod" || a.devices != 1)
    throw pushpull::InvalidArgument("--elastic needs --mode horovod and one device per worker");
  const auto wall0 = Clock::now();
  hvd::init();
  fmt::print("elastic worker pid {} rank {} size {}\n", getpid(), hvd::rank(), hvd::size());
  std::fflush(stdout);
  pushpull::torch::configure_torch_threads(1, a.threads);
  const Split train = load_split(a.data_dir, "train");
  const Split test = load_split(a.data_dir, "t10k");
  torch::manual_seed(static_cast<uint64_t>(a.seed));
  std::vector<LeNet> models{make_lenet(a.model)};
  LeNet& model = models[0];
  torch::optim::SGD sgd(model->parameters(),
                        torch::optim::SGDOptions(a.lr).momentum(a.momentum).weight_decay(a.wd));
  el::ElasticDistributedOptimizer opt(sgd, pushpull::torch::named(model->named_parameters()));
  int64_t epoch = 0, done = 0, epoch_steps = 0, steps = 0;
  el::TorchState state(*model, sgd);
  state.add_value("epoch", &epoch);
  state.add_value("done", &done);
  state.add_value("epoch_steps", &epoch_steps);
  state.add_value("steps", &steps);
  state.track(opt);
  state.register_reset_callbacks({[] {
    fmt::print("elastic reset: rank {} of {}\n", hvd::rank(), hvd::size());
    std::fflush(stdout);
  }});
  pushpull::torch::ReplicaRunner runner(1);
  const int64_t bs = a.batch_size;
  el::run(state, [&] {
    while (epoch < a.epochs) {
      const int64_t rank = hvd::rank(), size = hvd::size();
      // The epoch's permutation (the same everywhere), minus what is done.
      std::vector<int64_t> perm(static_cast<size_t>(train.size()));
      std::iota(perm.begin(), perm.end(), 0);
      std::mt19937_64 rng(a.seed + static_cast<uint64_t>(epoch));
      std::shuffle(perm.begin(), perm.end(), rng);
      // Each step takes the next size x bs samples of the permutation, rank r
      // every size-th from r: after a re-formation the rest of the epoch is
      // split among the new ranks from the committed position.
      while (!(a.max_batches > 0 && epoch_steps >= a.max_batches) &&
             train.size() - done >= size * bs) {
        std::vector<int64_t> idx(static_cast<size_t>(bs));
        for (int64_t i = 0; i < bs; ++i)
          idx[static_cast<size_t>(i)] = perm[static_cast<size_t>(done + i * size + rank)];
        auto it = torch::from_blob(idx.data(), {bs}, torch::kInt64);
        auto x = train.x.index_select(0, it), y = train.y.index_select(0, it);
        auto loss = F::cross_entropy(model->forward(x), y);
        loss.backward();
        opt.step();
        opt.zero_grad();
        done += size * bs;
        ++steps;
        ++epoch_steps;
        if (steps % a.log_every == 0) {
          fmt::print(
              "elastic step {} size {} rank {} t={:.3f} loss {:.4f}\n", steps, size, rank,
              std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                  .count(),
              loss.item<double>());
          std::fflush(stdout);
        }
        if (steps % a.commit_every == 0) state.commit();
      }
      if (rank == 0) {
        const double acc = test_accuracy(models, runner, test, a.test_limit);
        fmt::print("elastic epoch {} test accuracy {:.4f} size {}\n", epoch, acc, size);
        std::fflush(stdout);
      }
      ++epoch;
      done = 0;
      epoch_steps = 0;
      state.commit();
    }
  });
  if (hvd::rank() == 0) {
    const double acc = test_accuracy(models, runner, test, a.test_limit);
    fmt::print("elastic summary: test accuracy {:.4f} steps {} size {} time {:.1f} s\n", acc, steps,
               hvd::size(), seconds_since(wall0));
    std::fflush(stdout);
  }
  hvd::shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app("LeNet on Fashion-MNIST, data parallel through a pushpull KVStore");
  app.add_option("--kvstore", a.kvstore,
                 "Store type: local, dist_sync, dist_async, dist_device_sync, dist_sync_allreduce")
      ->capture_default_str();
  app.add_option("--devices-per-worker", a.devices, "Model replicas (CPU devices) per worker")
      ->capture_default_str();
  app.add_option("--epochs", a.epochs)->capture_default_str();
  app.add_option("--batch-size", a.batch_size, "Samples per worker per step")
      ->capture_default_str();
  app.add_option("--lr", a.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--momentum", a.momentum)->capture_default_str();
  app.add_option("--wd", a.wd, "Weight decay")->capture_default_str();
  app.add_option("--seed", a.seed, "Weights and shuffling")->capture_default_str();
  app.add_option("--data-dir", a.data_dir, "Directory of the IDX files")->capture_default_str();
  app.add_option("--update-on-kvstore", a.update_on_kvstore,
                 "Run the optimizer on the store (true) or on the worker (false)")
      ->capture_default_str();
  app.add_option("--fuse-below", a.fuse_below,
                 "kvstore mode: parameters under this many bytes share flat keys (0: one key "
                 "per parameter)")
      ->capture_default_str();
  app.add_option("--max-batches", a.max_batches, "Batches per epoch at most (0: all)")
      ->capture_default_str();
  app.add_option("--test-limit", a.test_limit, "Test images evaluated (0: all)")
      ->capture_default_str();
  app.add_option("--log-every", a.log_every, "Batches between progress lines")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--threads", a.threads, "libtorch threads per device (0: cores / devices)")
      ->capture_default_str();
  app.add_option("--model", a.model, "mxnet (20/50 filters, 500 hidden) or small (6/16, 120)")
      ->capture_default_str();
  app.add_option("--compression", a.compression,
                 "Gradient compression: none, 2bit, 1bit, fp16 (the store's); --mode horovod: "
                 "none or fp16 (the DistributedOptimizer's)")
      ->capture_default_str();
  app.add_option("--compression-threshold", a.compression_threshold,
                 "Threshold of 2bit / 1bit compression (default 0.5)");
  app.add_option("--mode", a.mode,
                 "kvstore (Trainer over --kvstore) or horovod (DistributedOptimizer over the "
                 "collectives; launch with -s 0)")
      ->capture_default_str();
  app.add_flag("--elastic", a.elastic,
               "With --mode horovod: Horovod's elastic recipe, under `pushpull launch "
               "--min-workers A --max-workers B` (docs/elastic.md)");
  app.add_option("--commit-every", a.commit_every, "--elastic: steps between commits")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (a.elastic) return run_elastic(a);
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lenet: error: %s\n", e.what());
    return 1;
  }
}
