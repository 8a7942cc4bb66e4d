// SPDX-License-Identifier: Apache-2.0
// `pushpull bench step`: a synthetic data-parallel training step (Horovod's
// synthetic benchmark, in the shape a PyTorch user sees), pushpull's two
// PyTorch front ends next to what that user would pick instead, in the same
// run:
//
//   ddp      torch.nn.parallel.DistributedDataParallel, gloo backend
//   hvd      pushpull.torch.DistributedOptimizer (collectives engine)
//   trainer  pushpull.torch.Trainer over a dist_sync KVStore, S servers
//   hvd_shm  hvd with PUSHPULL_SHM=1 (collective data through shared memory)
//            (hvd itself runs with PUSHPULL_SHM=0: TCP loopback)
//   cpp      the libtorch pushpull::torch::DistributedOptimizer
//            (integrations/torch/examples/bench_step.cpp, bin/pp_torch_step),
//            with the defaults a user gets (shared memory on one host)
//   ddp-gloo      DDP over gloo (python/pushpull/bench_step_ddp.py)
//   ddp-pushpull  DDP over the torch.distributed backend "pushpull", with
//                 PUSHPULL_SHM=1 (shared memory on one host, as for hvd_shm)
//   local    no exchange: each rank trains its own copy (plain SGD), the N
//            ranks side by side on this machine's cores; the floor under
//            every other row (what the compute alone costs here)
//
// Every implementation is one job of `pushpull launch -n N -s S` running
// `python3 -m pushpull.bench_step` (python/pushpull/bench_step.py, which
// builds the model and times the steps), or pp_torch_step for cpp. With --repeats R the
// implementations run R times interleaved (ddp, hvd, trainer, ddp, ...) and a
// row is the median of the R per-run medians; `vs_ddp` is that median over
// DDP's (ddp, else ddp-gloo) median of the same run. The machine is shared and noisy: only
// compare figures from one run.
//
// The Python package is found next to this executable (build/bin ->
// build/python) unless PYTHONPATH already names one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_procs.h"
#include "bench_step_netns.h"
#include "commands.h"
#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull::cli {
namespace {

struct Config {
  std::string ranks = "2";
  std::string grad_mb = "4,64";
  std::string impls = "ddp,hvd,trainer";
  int layers = 8;
  int batch = 4;
  int steps = 15;
  int warmup = 3;
  int repeats = 3;
  int servers = 0;  // 0: as many servers as workers
  int timeout_s = 600;
  std::string format = "table";
  std::string python = "/usr/bin/python3";  // where Debian's torch is
  int netns = 0;  // > 0: one rank per network-namespace host (bench_step_netns.h)
  std::string rate = "1gbit";
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// "result <impl> <ms>" from rank 0, anywhere in the launcher's output.
bool parse_result(const std::string& out, const std::string& impl, double* ms) {
  std::istringstream in(out);
  std::string word;
  while (in >> word) {
    if (word != "result") continue;
    std::string name;
    double v = 0;
    if (in >> name >> v && name == impl) {
      *ms = v;
      return true;
    }
  }
  return false;
}

// PYTHONPATH with the package built next to this executable in front.
void export_python_path() {
  std::filesystem::path pkg = std::filesystem::path(self_dir()).parent_path() / "python";
  if (!std::filesystem::exists(pkg / "pushpull" / "bench_step.py")) return;
  std::string path = pkg.string();
  if (auto old = Environment::current().get("PYTHONPATH"); old && !old->empty()) path += ":" + *old;
  ::setenv("PYTHONPATH", path.c_str(), 1);
  ::setenv("OMP_NUM_THREADS", "1", 0);
}

std::string format_mb(double mb) {
  return mb == static_cast<int64_t>(mb) ? fmt::format("{}", static_cast<int64_t>(mb))
                                        : fmt::format("{}", mb);
}

void run_bench(const Config& cfg) {
  const auto impls = split(cfg.impls);
  for (const auto& i : impls)
    if (i != "ddp" && i != "hvd" && i != "trainer" && i != "hvd_shm" && i != "ddp-gloo" &&
        i != "ddp-pushpull" && i != "cpp" && i != "local")
      throw InvalidArgument(fmt::format(
          "bench step: --impls {}: known are ddp, hvd, hvd_shm, trainer, ddp-gloo, ddp-pushpull, "
          "cpp, local",
          i));
  const std::string cpp_worker = self_dir() + "/pp_torch_step";
  if (std::find(impls.begin(), impls.end(), "cpp") != impls.end() &&
      !std::filesystem::exists(cpp_worker))
    throw InvalidArgument(fmt::format(
        "bench step: --impls cpp needs {} (built with libtorch: -DPUSHPULL_BUILD_TORCH=ON)",
        cpp_worker));
  std::vector<double> sizes;
  for (const auto& s : split(cfg.grad_mb)) {
    double mb = std::stod(s);
    if (!(mb > 0)) throw InvalidArgument(fmt::format("bench step: --grad-mb {}: must be > 0", s));
    sizes.push_back(mb);
  }
  std::vector<int> ranks;
  for (const auto& s : split(cfg.ranks)) {
    int n = std::stoi(s);
    if (n < 1 || n > 64) throw InvalidArgument(fmt::format("bench step: -n {}: need 1..64", n));
    ranks.push_back(n);
  }
  export_python_path();
  if (cfg.netns > 0) {
    run_step_netns({cfg.netns, cfg.rate, impls, sizes, cfg.layers, cfg.batch, cfg.steps, cfg.warmup,
                    cfg.repeats, cfg.timeout_s, cfg.python, cfg.format == "csv"});
    return;
  }
  const bool csv = cfg.format == "csv";
  if (csv)
    std::printf(
        "impl,n,servers,grad_bytes,layers,step_ms,vs_ddp,paired_median,paired_min,paired_max\n");
  for (int n : ranks) {
    const int servers = cfg.servers > 0 ? cfg.servers : n;
    for (double mb : sizes) {
      std::map<std::string, std::vector<double>> got;
      for (int rep = 0; rep < cfg.repeats; ++rep) {
        for (const auto& impl : impls) {
          TempDir dir;
          ProcessGroup g;
          const std::string script_impl = impl == "hvd_shm" ? "hvd" : impl;
          const bool shm = impl == "hvd_shm" || impl == "ddp-pushpull";
          std::vector<std::string> argv = {
              self_exe(),  "launch",
              "-n",        std::to_string(n),
              "-s",        std::to_string(impl == "trainer" ? servers : 0),
              "--timeout", std::to_string(cfg.timeout_s),
              "--env",     shm || impl == "cpp" ? "PUSHPULL_SHM=1" : "PUSHPULL_SHM=0",
              "--"};
          if (impl == "cpp") {
            argv.push_back(cpp_worker);
          } else {
            argv.insert(argv.end(), {cfg.python, "-m", "pushpull.bench_step", "--impl", script_impl,
                                     "--store-dir", dir.path()});
          }
          argv.insert(argv.end(),
                      {"--grad-mb", format_mb(mb), "--layers", std::to_string(cfg.layers),
                       "--batch", std::to_string(cfg.batch), "--steps", std::to_string(cfg.steps),
                       "--warmup", std::to_string(cfg.warmup)});
          g.start(argv);
          auto res = g.run(std::chrono::seconds(cfg.timeout_s + 30));
          double ms = 0;
          if (!res.ok || !parse_result(res.output, script_impl, &ms)) {
            std::fprintf(stderr, "bench step: %s n=%d %s MiB failed: %s; left out of its row\n",
                         impl.c_str(), n, format_mb(mb).c_str(),
                         res.ok ? "no result line" : res.failure.c_str());
            ms = std::nan("");  // keeps the rounds aligned for the paired ratios
          }
          got[impl].push_back(ms);
        }
      }
      const char* base = got.count("ddp") ? "ddp" : "ddp-gloo";
      const double ddp = median(got[base]);
      if (!csv)
        std::printf(
            "\nstep, %d workers, %s MiB of gradients in %d layers, batch %d, median of %d "
            "steps, median of %d interleaved run(s)\n%-10s %12s %8s   %s\n",
            n, format_mb(mb).c_str(), cfg.layers, cfg.batch, cfg.steps, cfg.repeats, "impl",
            "step ms", "vs ddp", "paired vs ddp: median (min-max) over the runs");
      for (const auto& impl : impls) {
        const double ms = median(got[impl]);
        if (ms == 0) continue;  // every run failed
        const PairedRatio paired = paired_ratio(got[impl], got[base]);
        const std::string ratio = ddp > 0 ? fmt::format("{:.3f}", ms / ddp) : "";
        const std::string name = impl == "trainer" ? fmt::format("trainer_{}s", servers) : impl;
        if (csv)
          std::printf("%s,%d,%d,%llu,%d,%.3f,%s,%s\n", name.c_str(), n,
                      impl == "trainer" ? servers : 0,
                      static_cast<unsigned long long>(mb * (1 << 20)), cfg.layers, ms,
                      ratio.c_str(), paired_csv(paired).c_str());
        else
          std::printf("%-12s %12.2f %8s   %s\n", name.c_str(), ms, ratio.c_str(),
                      impl == base ? "" : format_paired(paired).c_str());
      }
      std::fflush(stdout);
    }
  }
}

}  // namespace

void register_bench_step(CLI::App& bench) {
  auto cfg = std::make_shared<Config>();
  auto* cmd = bench.add_subcommand(
      "step",
      "A synthetic training step: torch DDP (gloo) vs pushpull.torch.DistributedOptimizer and "
      "Trainer");
  cmd->add_option("-n,--ranks", cfg->ranks, "Numbers of workers, e.g. 2,4")->capture_default_str();
  cmd->add_option("--grad-mb", cfg->grad_mb, "MiB of gradients (float32), e.g. 1,4,64,256")
      ->capture_default_str();
  cmd->add_option("--layers", cfg->layers, "Linear layers the gradients are split over")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--impls", cfg->impls,
                  "Implementations: ddp,hvd,hvd_shm,trainer,ddp-gloo,ddp-pushpull,cpp,local")
      ->capture_default_str();
  cmd->add_option("--servers", cfg->servers, "Parameter servers for trainer (0: as many as -n)")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  cmd->add_option("--batch", cfg->batch, "Rows per batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--steps", cfg->steps, "Timed steps per run")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", cfg->warmup, "Untimed steps first")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--repeats", cfg->repeats, "Interleaved runs of every implementation")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->add_option("--timeout", cfg->timeout_s, "Seconds one run may take")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--python", cfg->python, "Python interpreter")->capture_default_str();
  cmd->add_option("--format", cfg->format, "table or csv")
      ->capture_default_str()
      ->check(CLI::IsMember({"table", "csv"}));
  cmd->add_option("--netns", cfg->netns,
                  "One rank per network-namespace host, links shaped to --rate (needs root; "
                  "ddp-gloo and ddp-pushpull only); -n is ignored")
      ->check(CLI::Range(0, 16));
  cmd->add_option("--rate", cfg->rate, "With --netns: tc tbf rate of every link ('' = unshaped)")
      ->capture_default_str();
  cmd->callback([cfg] { run_bench(*cfg); });
}

}  // namespace pushpull::cli
