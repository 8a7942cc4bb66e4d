// SPDX-License-Identifier: Apache-2.0
// `pushpull bench allreduce`: float32 sum allreduce on loopback, pushpull's
// TCP ring (and its ring over shared memory, `pushpull_shm`) next to Open MPI's MPI_Allreduce (over
// TCP and over its default shared-memory transport) and Gloo's ring allreduce over TCP, in the same
// run, on the same sizes, every implementation as one process per rank.
//
// For each n and size: the median over iterations of the slowest rank's time
// (a barrier before each iteration), algbw = bytes / time and busbw = algbw *
// 2(n-1)/n (the nccl-tests convention). With --repeats R every
// implementation runs R times, interleaved (pushpull, peers, pushpull, ...),
// and the row is the median of the R medians: the machine is shared and
// noisy, so never compare figures from different runs.
//
// With --netns H --ranks-per-host L (L > 1) the H*L ranks run L to a
// namespace and pushpull_hier (the hierarchical allreduce,
// collective/hierarchical.h) runs beside the flat ring, compared with
// hier_bound = 2(H-1)/H * S / B, the least any allreduce needs over host
// links of goodput B (time inside a host neglected).
//
// Peers: bin/pp_mpi_allreduce (under mpirun) and bin/pp_gloo_allreduce, built
// from bench/peers/ when Open MPI and Gloo are installed; a missing peer is
// reported and skipped.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <sstream>

#include <fmt/format.h>

#include "bench_allreduce.h"
#include "bench_common.h"
#include "bench_netns.h"
#include "bench_procs.h"
#include "commands.h"
#include "pushpull/error.h"

namespace pushpull::cli {
namespace {

struct Config {
  std::string ranks = "2,4,8";
  std::string sizes = "4K,64K,1M,16M,64M";
  int iters = 0;  // 0: by size
  int warmup = 1;
  int repeats = 3;
  int timeout_s = 300;
  int netns = 0;           // > 0: ranks in that many shaped network namespaces
  int ranks_per_host = 1;  // with netns: ranks in each namespace
  std::string rate = "1gbit";
  BenchFlags flags;
  WorkerArgs worker;
  std::string worker_sizes, worker_iters;
  std::string compression = "none";  // pushpull rows: "none,fp16" times both
  std::string tls = "off";           // "both": a pushpull_tls row beside every pushpull row
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    out.push_back(item);
  return out;
}

std::string join_list(const auto& v) {
  std::string s;
  for (auto& x : v)
    s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// The lower bound of an allreduce of `bytes` among `hosts` hosts whose links
// carry `bps` each way: 2(H-1)/H * bytes / bps, in microseconds.
double hier_bound_us(int hosts, uint64_t bytes, double bps) {
  return 2.0 * (hosts - 1) / hosts * static_cast<double>(bytes) * 8 / bps * 1e6;
}

// Enough iterations for a stable median without making large sizes slow.
int iters_for(uint64_t bytes, int fixed) {
  if (fixed > 0) return fixed;
  return static_cast<int>(
      std::clamp<uint64_t>((uint64_t{128} << 20) / std::max<uint64_t>(bytes, 1), 5, 40));
}

// "result <bytes> <us>" lines -> bytes -> us.
std::map<uint64_t, double> parse_results(const std::string& out) {
  std::map<uint64_t, double> r;
  std::istringstream in(out);
  std::string word;
  while (in >> word) {
    if (word != "result") continue;
    uint64_t b = 0;
    double us = 0;
    if (in >> b >> us) r[b] = us;
  }
  return r;
}

struct Impl {
  std::string name;
  // Starts the n processes of one run into `g`; `dir` is a fresh directory;
  // with `lab`, rank r runs in its host namespace r.
  std::function<void(ProcessGroup& g, int n, const std::string& dir,
                     const std::vector<std::string>& tail, const NetnsLab* lab)>
      start;
};

// With a lab, rank r runs in namespace r / per_host (consecutive ranks share a host).
// argv for rank r: inside its namespace when there is a lab.
std::vector<std::string> in_host(const NetnsLab* lab, int per_host, int r,
                                 std::vector<std::string> argv) {
  if (!lab) return argv;
  auto pre = lab->exec(r / per_host);
  pre.insert(pre.end(), argv.begin(), argv.end());
  return pre;
}
std::string host_of(const NetnsLab* lab, int per_host, int r) {
  return lab ? lab->address(r / per_host) : std::string("127.0.0.1");
}

std::vector<Impl> implementations(bool peers, bool netns, int per_host,
                                  const std::vector<std::string>& compressions,
                                  const std::string& tls) {
  std::vector<Impl> out;
  const std::string bin = self_dir();
  // One pushpull rank group: `transport` is "tcp" or "shm", `comp` "none" or
  // a codec the worker applies inside the timing, `algo` "flat" or "hier".
  // `encrypted`: the ranks run with PUSHPULL_TLS=1 (docs/security.md "Encryption").
  auto pushpull_ranks = [per_host](std::string transport, std::string comp,
                                   std::string algo = "flat", bool encrypted = false) {
    return [transport, comp, algo, per_host, encrypted](
               ProcessGroup& g, int n, const std::string& dir, const std::vector<std::string>& tail,
               const NetnsLab* lab) {
      for (int r = 0; r < n; ++r) {
        std::vector<std::string> argv = {self_exe(),
                                         "bench",
                                         "allreduce",
                                         "--worker-rank",
                                         std::to_string(r),
                                         "--worker-size",
                                         std::to_string(n),
                                         "--worker-host",
                                         host_of(lab, per_host, r),
                                         "--rendezvous",
                                         dir,
                                         "--worker-transport",
                                         transport,
                                         "--worker-compression",
                                         comp,
                                         "--worker-algo",
                                         algo};
        for (const auto& x : tail)
          argv.push_back(x == "--iters" ? "--worker-iters" : x);
        if (encrypted) argv.insert(argv.begin(), {"env", "PUSHPULL_TLS=1"});
        g.start(in_host(lab, per_host, r, argv));
      }
    };
  };
  // Shared memory only between ranks of one host (not across namespaces).
  if (!netns) out.push_back({"pushpull_shm", pushpull_ranks("shm", "none")});
  for (const std::string& comp : compressions) {
    const std::string name = comp == "none" ? "pushpull" : "pushpull_" + comp;
    if (tls != "on") out.push_back({name, pushpull_ranks("tcp", comp)});
    if (tls != "off") out.push_back({name + "_tls", pushpull_ranks("tcp", comp, "flat", true)});
  }
  // Several ranks per host: the hierarchical allreduce beside the flat ring.
  if (per_host > 1) out.push_back({"pushpull_hier", pushpull_ranks("tcp", "none", "hier")});
  if (!peers) return out;
  const std::string mpi = bin + "/pp_mpi_allreduce", gloo = bin + "/pp_gloo_allreduce";
  if (netns) {
    std::fprintf(stderr,
                 "bench allreduce: Open MPI is not run across namespaces (mpirun would need ssh "
                 "into each); its rows are missing\n");
  } else if (std::filesystem::exists(mpi)) {
    auto mpirun = [mpi](bool tcp) {
      return [mpi, tcp](ProcessGroup& g, int n, const std::string&,
                        const std::vector<std::string>& tail, const NetnsLab*) {
        std::vector<std::string> argv = {"mpirun", "-n", std::to_string(n), "--oversubscribe"};
        if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
        argv.insert(argv.end(), {"--mca", "oob_tcp_if_include", "lo"});
        if (tcp)
          argv.insert(argv.end(),
                      {"--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"});
        argv.push_back(mpi);
        argv.insert(argv.end(), tail.begin(), tail.end());
        g.start(argv);
      };
    };
    out.push_back({"openmpi_tcp", mpirun(true)});
    out.push_back({"openmpi_shm", mpirun(false)});
  } else {
    std::fprintf(stderr, "bench allreduce: %s not built (Open MPI missing?); skipping it\n",
                 mpi.c_str());
  }
  if (std::filesystem::exists(gloo)) {
    out.push_back(
        {"gloo", [gloo, per_host](ProcessGroup& g, int n, const std::string& dir,
                                  const std::vector<std::string>& tail, const NetnsLab* lab) {
           for (int r = 0; r < n; ++r) {
             std::vector<std::string> argv = {gloo, std::to_string(r), std::to_string(n), dir};
             argv.insert(argv.end(), tail.begin(), tail.end());
             argv.insert(argv.end(), {"--host", host_of(lab, per_host, r)});
             g.start(in_host(lab, per_host, r, argv));
           }
         }});
  } else {
    std::fprintf(stderr, "bench allreduce: %s not built (Gloo missing?); skipping it\n",
                 gloo.c_str());
  }
  return out;
}

void run_bench(const Config& cfg) {
  std::vector<int> ranks;
  for (uint64_t r : parse_sizes(cfg.ranks)) {
    if (r < 1 || r > 64) throw InvalidArgument(fmt::format("-n {}: need 1..64 ranks", r));
    ranks.push_back(static_cast<int>(r));
  }
  const std::vector<uint64_t> sizes = parse_sizes(cfg.sizes);
  std::vector<int> iters;
  for (uint64_t b : sizes)
    iters.push_back(iters_for(b, cfg.iters));
  const std::vector<std::string> tail = {"--sizes",  join_list(sizes),
                                         "--iters",  join_list(iters),
                                         "--warmup", std::to_string(cfg.warmup)};
  std::unique_ptr<NetnsLab> lab;
  double goodput = 0;
  const int per_host = cfg.ranks_per_host;
  if (per_host > 1 && cfg.netns < 1)
    throw InvalidArgument("--ranks-per-host needs --netns (the hosts are network namespaces)");
  if (cfg.netns > 0) {
    ranks = {cfg.netns * per_host};
    lab = std::make_unique<NetnsLab>(cfg.netns, cfg.rate);
    goodput = lab->goodput_bps(2);
  }
  const auto impls = implementations(cfg.flags.peers(), lab != nullptr, per_host,
                                     split_list(cfg.compression), cfg.tls);
  BenchTable table(cfg.flags);
  for (int n : ranks) {
    RepeatMedians got;  // impl -> bytes -> one median per repeat
    for (int rep = 0; rep < cfg.repeats; ++rep) {
      for (const auto& impl : impls) {
        TempDir dir;
        ProcessGroup g;
        impl.start(g, n, dir.path(), tail, lab.get());
        auto res = g.run(std::chrono::seconds(cfg.timeout_s));
        if (!res.ok) {
          std::fprintf(stderr, "bench allreduce: %s with n=%d failed: %s; its rows are missing\n",
                       impl.name.c_str(), n, res.failure.c_str());
          continue;
        }
        for (auto& [bytes, us] : parse_results(res.output))
          got[impl.name][bytes].push_back(us);
      }
    }
    for (const auto& impl : impls) {
      for (uint64_t bytes : sizes) {
        auto it = got[impl.name].find(bytes);
        if (it == got[impl.name].end()) continue;
        double us = median(it->second);
        double algbw = static_cast<double>(bytes) / (us * 1e-6) / 1e9;
        table.add({impl.name, n, bytes, us, algbw, algbw * 2.0 * (n - 1) / n});
      }
    }
    if (lab && goodput > 0) {
      // The ring's lower bound 2(n-1)/n * S / B at the measured goodput B,
      // as a row of its own (impl "ring_bound") so csv readers get it too.
      for (uint64_t bytes : sizes) {
        double us = 2.0 * (n - 1) / n * static_cast<double>(bytes) * 8 / goodput * 1e6;
        double algbw = static_cast<double>(bytes) / (us * 1e-6) / 1e9;
        table.add({"ring_bound", n, bytes, us, algbw, algbw * 2.0 * (n - 1) / n});
      }
      // With H hosts of several ranks: the lower bound of any allreduce
      // (impl "hier_bound"): every host link carries 2(H-1)/H * S each way
      // (a host must send its H-1 other hosts' shares of its partial sums
      // and receive theirs of the result), the time inside a host neglected.
      if (per_host > 1)
        for (uint64_t bytes : sizes) {
          double us = hier_bound_us(cfg.netns, bytes, goodput);
          double algbw = static_cast<double>(bytes) / (us * 1e-6) / 1e9;
          table.add({"hier_bound", n, bytes, us, algbw, algbw * 2.0 * (n - 1) / n});
        }
    }
    table.print(lab ? fmt::format("allreduce float32 sum, n = {} ranks in {} network namespaces "
                                  "({} per namespace), links shaped to {} (goodput {:.3f} "
                                  "Gbit/s), median of {} repeat(s)",
                                  n, cfg.netns, per_host, cfg.rate.empty() ? "nothing" : cfg.rate,
                                  goodput / 1e9, cfg.repeats)
                    : fmt::format("allreduce float32 sum, n = {} ranks on loopback, median of {} "
                                  "repeat(s)",
                                  n, cfg.repeats));
    if (cfg.compression != "none" && !cfg.flags.csv())
      print_codec_summary(split_list(cfg.compression), sizes, n, got);
    if (lab && goodput > 0 && !cfg.flags.csv()) {
      for (const auto& impl : impls)
        for (uint64_t bytes : sizes) {
          auto it = got[impl.name].find(bytes);
          if (it == got[impl.name].end() || impl.name == "pushpull_hier") continue;
          double bound = 2.0 * (n - 1) / n * static_cast<double>(bytes) * 8 / goodput * 1e6;
          std::printf("%-12s %10s: %.3fx the ring lower bound (%.3f s)\n", impl.name.c_str(),
                      format_bytes(bytes).c_str(), median(it->second) / bound, bound / 1e6);
        }
      auto& flat = got["pushpull"];
      auto& hier = got["pushpull_hier"];
      for (uint64_t bytes : sizes) {
        if (!hier.count(bytes)) continue;
        const double h = median(hier[bytes]), bound = hier_bound_us(cfg.netns, bytes, goodput);
        std::printf("pushpull_hier %9s: %.3fx the hierarchical lower bound (%.3f s)",
                    format_bytes(bytes).c_str(), h / bound, bound / 1e6);
        if (flat.count(bytes))
          std::printf("; %.2fx faster than the flat ring", median(flat[bytes]) / h);
        std::printf("\n");
      }
    }
  }
}

}  // namespace

void register_bench_allreduce(CLI::App& bench) {
  auto cfg = std::make_shared<Config>();
  auto* cmd = bench.add_subcommand(
      "allreduce",
      "Allreduce on loopback: pushpull's TCP ring vs Open MPI (TCP, shared memory) and Gloo");
  cmd->add_option("-n,--ranks", cfg->ranks, "Numbers of ranks, e.g. 2,4,8")->capture_default_str();
  cmd->add_option("--sizes", cfg->sizes, "Sizes: 4K..256M (powers of two) or a list 4K,1M")
      ->capture_default_str();
  cmd->add_option("--iters", cfg->iters, "Timed iterations per size (0: 40 small .. 5 large)")
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--warmup", cfg->warmup, "Untimed iterations per size")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--repeats", cfg->repeats,
                  "Interleaved runs of every implementation; rows are the median")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->add_option("--timeout", cfg->timeout_s, "Seconds one run of one implementation may take")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--netns", cfg->netns,
                  "Run ranks in N network namespaces (made and removed here; needs root) "
                  "instead of loopback, --ranks-per-host in each; -n is ignored")
      ->check(CLI::Range(0, 16));
  cmd->add_option("--ranks-per-host", cfg->ranks_per_host,
                  "With --netns: ranks in each namespace (consecutive ranks share one); above 1 "
                  "the hierarchical allreduce (pushpull_hier) runs beside the flat ring")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  cmd->add_option("--rate", cfg->rate, "With --netns: tc tbf rate of every link ('' = unshaped)")
      ->capture_default_str();
  cmd->add_option("--compression", cfg->compression,
                  "pushpull rows to time, interleaved: none, fp16 (float16 on the ring, with a "
                  "residual), 2bit, 1bit (codes allgathered and summed by every rank), "
                  "2bit_rs, 1bit_rs (a compressed reduce-scatter then allgather, two residuals: "
                  "for comparison), e.g. none,fp16,2bit,1bit")
      ->capture_default_str()
      ->check([](const std::string& v) {
        for (const auto& c : split_list(v))
          if (c != "none" && c != "fp16" && c != "2bit" && c != "1bit" && c != "2bit_rs" &&
              c != "1bit_rs")
            return fmt::format(
                "'{}': not a compression type (none, fp16, 2bit, 1bit; 2bit_rs, 1bit_rs: "
                "the compressed reduce-scatter, for comparison)",
                c);
        return std::string();
      });
  add_bench_flags(cmd, &cfg->flags);
  // Internal: one pushpull rank, started by the benchmark itself.
  cmd->add_option("--worker-rank", cfg->worker.rank)->group("");
  cmd->add_option("--worker-size", cfg->worker.size)->group("");
  cmd->add_option("--rendezvous", cfg->worker.rendezvous_dir)->group("");
  cmd->add_option("--worker-iters", cfg->worker_iters)->group("");
  cmd->add_option("--worker-host", cfg->worker.host)->group("");
  cmd->add_option("--worker-transport", cfg->worker.transport)
      ->group("")
      ->check(CLI::IsMember({"tcp", "shm"}));
  cmd->add_option("--tls", cfg->tls,
                  "pushpull rows over TLS 1.3 (PUSHPULL_TLS=1): off, on, or both (a _tls row "
                  "beside each, interleaved in the same run)")
      ->check(CLI::IsMember({"off", "on", "both"}));
  cmd->add_option("--worker-compression", cfg->worker.compression)->group("");
  cmd->add_option("--worker-algo", cfg->worker.algo)
      ->group("")
      ->check(CLI::IsMember({"flat", "hier"}));
  cmd->callback([cfg, cmd] {
    if (cfg->worker.rank >= 0) {
      WorkerArgs w = cfg->worker;
      for (uint64_t b : parse_sizes(cfg->sizes))
        w.sizes.push_back(b);
      for (uint64_t i : parse_sizes(cfg->worker_iters))
        w.iters.push_back(static_cast<int>(i));
      if (w.iters.size() == 1) w.iters.resize(w.sizes.size(), w.iters[0]);
      w.warmup = cfg->warmup;
      if (w.iters.size() != w.sizes.size() || w.size < 1 || w.rank >= w.size)
        throw InvalidArgument("bench allreduce worker: inconsistent --worker-* arguments");
      if (int rc = run_allreduce_worker(w); rc != 0) throw CLI::RuntimeError(rc);
      return;
    }
    if (cfg->netns > 0 && !cmd->count("--sizes")) cfg->sizes = "64M";
    run_bench(*cfg);
  });
}

}  // namespace pushpull::cli
