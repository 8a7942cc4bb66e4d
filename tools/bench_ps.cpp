// SPDX-License-Identifier: Apache-2.0
// `pushpull bench ps`: parameter-server push+pull throughput on loopback.
//
// For each (workers N, servers S, size): a job of N workers and S servers runs
// in this process (threads, real TCP on loopback); every worker pushpulls one
// float32 key of that size, `--iters` times after a warm-up, and a barrier
// lines the workers up before each timed iteration. The figure is the median
// over iterations of the slowest worker's time; GB/s counts the bytes each
// worker pushed and pulled (2 x size: a push and a pull each move the array
// once). Single-stream iperf3 in the same run is the ceiling for 1 worker x
// 1 server. Sizes above the big-array bound are split over all servers.
//
// --replicas 0,1: each job is measured once per replication setting
// (PUSHPULL_PS_REPLICAS, docs/ps.md "Fault tolerance"), one after the other
// in the same run; rows are named pushpull_<S>s_r<R>.
//
// --compression none,fp16,2bit,1bit: each size is timed with every listed
// gradient compression (docs/kvstore.md), interleaved within each iteration
// so they share the machine's load; rows are named pushpull_<S>s_<type>.
// GB/s stays 2 x size / time (what the model moved); "wire" lines give the
// bytes one worker sent and received per pushpull and their ratio to none.
//
// --transport tcp,shm: each job once with payloads over loopback TCP and
// once through same-host shared memory (PUSHPULL_PS_SHM, docs/transport.md);
// rows are named pushpull_<S>s_<transport>. With --repeats R every
// (replicas, transport) job runs R times, interleaved round by round, and
// rows are the medians; ratio lines compare shm with tcp and r1 with r0.
//
// --netns N (root): the same, as processes on N network-namespace hosts
// with links shaped to --rate (bench_ps_netns.h): a server and a worker per
// host, the scheduler on host 0.
#include <chrono>
#include <mutex>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_iperf.h"
#include "bench_ps_netns.h"
#include "bench_scaling.h"
#include "commands.h"
#include "compress/compressor.h"
#include "kvstore/inprocess_job.h"
#include "ps/placement.h"

namespace pushpull::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  BenchFlags flags;
  std::string workers = "1,2";
  std::string servers = "1,2";
  std::string sizes = "4K,64K,1M,16M,64M";
  int iters = 10;
  int iperf_seconds = 2;
  std::string compression = "none";
  // --netns H: H worker hosts; with --placement dedicated (the default) each
  // server on a host of its own next to the ring allreduce
  // (bench_scaling_ps.cpp); with colocated a server and a worker per host,
  // every --compression interleaved (bench_ps_netns.cpp).
  int netns = 0;
  std::string placement = "dedicated";
  std::string rate = "1gbit";
  int repeats = 1;
  int queue_ms = 50;
  bool ps_node = false;  // internal: one node of a colocated --netns job
  std::string ps_out;
  std::string replicas;   // --replicas: "" = the default setting, unlabelled
  std::string transport;  // --transport: "" = the default (shm on one host), unlabelled
};

// The compression types of --compression, checked by the stores' parser.
std::vector<compress::Settings> parse_compression(const std::string& text) {
  std::vector<compress::Settings> out;
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    std::string name = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    out.push_back(compress::parse_settings({{"type", name}}));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

// Payload bytes one worker sends (push) and receives (pull) per pushpull of
// `bytes` float32 bytes, with the store's placement and chunking over
// `servers` servers (a compressed part carries its own header). The
// benchmark's servers run no optimizer, so pulls come back compressed too
// (docs/kvstore.md "Compressed pulls"): push and pull are the same size.
uint64_t wire_bytes(const compress::Settings& c, uint64_t bytes, int servers, const Options& o) {
  if (!c.enabled()) return 2 * bytes;
  compress::Compressor comp(c);
  const auto n = static_cast<int64_t>(bytes / 4);
  uint64_t push = 0;
  for (const auto& part : ps::chunk(ps::place(0, n, servers, o.kvstore.bigarray_bound),
                                    std::max<int64_t>(1, o.kvstore.chunk_bytes / 4)))
    push += comp.encoded_bytes(static_cast<size_t>(part.count));
  return 2 * push;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    out.push_back(text.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

std::vector<int> parse_ints(const std::string& text) {
  std::vector<int> out;
  for (uint64_t v : parse_sizes(text))
    out.push_back(static_cast<int>(v));
  return out;
}

// Median seconds per pushpull (slowest worker), per compression and size.
std::vector<std::vector<double>> measure(int workers, int servers,
                                         const std::vector<uint64_t>& sizes, int iters,
                                         const std::vector<compress::Settings>& types,
                                         int replicas = -1, int shm = -1) {
  // The environment's PUSHPULL_* settings apply (PUSHPULL_PS_LEND=0,
  // PUSHPULL_PS_CHUNK_BYTES, ...), as on a launched job's nodes.
  InProcessJob job{servers, workers, "dist_sync", Options::from_env()};
  job.options.log_level = LogLevel::kWarning;
  job.options.cluster.ps_replicas = replicas;
  if (shm >= 0) job.options.net.ps_shared_memory = shm == 1;
  std::mutex mu;
  // per type and size, per iteration: the slowest worker's time
  std::vector<std::vector<std::vector<double>>> slowest(
      types.size(),
      std::vector<std::vector<double>>(sizes.size(), std::vector<double>(iters, 0.0)));
  auto params = [](const compress::Settings& c) {
    std::map<std::string, std::string> p{{"type", std::string(compress::type_name(c.type))}};
    return p;
  };
  run_inprocess_job(job, [&](KVStore& kv) {
    for (size_t s = 0; s < sizes.size(); ++s) {
      int64_t n = static_cast<int64_t>(sizes[s] / 4);
      Array grad = Array::full(Shape{n}, 1.0), out(Shape{n}, DType::kFloat32);
      auto key = [&](size_t t) { return static_cast<int64_t>(s * types.size() + t); };
      for (size_t t = 0; t < types.size(); ++t) {
        kv.init(key(t), grad.view());
        kv.set_gradient_compression(params(types[t]));
        kv.pushpull(key(t), grad.view(), out.view());  // warm-up: pools, pages
      }
      for (int i = 0; i < iters; ++i) {
        for (size_t t = 0; t < types.size(); ++t) {  // interleaved: the same load for each
          kv.set_gradient_compression(params(types[t]));
          kv.barrier();
          auto t0 = Clock::now();
          kv.pushpull(key(t), grad.view(), out.view());
          double secs = std::chrono::duration<double>(Clock::now() - t0).count();
          std::lock_guard lock(mu);
          double& slot = slowest[t][s][static_cast<size_t>(i)];
          slot = std::max(slot, secs);
        }
      }
    }
  });
  std::vector<std::vector<double>> out(types.size());
  for (size_t t = 0; t < types.size(); ++t)
    for (auto& v : slowest[t])
      out[t].push_back(median(v));
  return out;
}

void print_wire(const std::vector<compress::Settings>& types, const std::vector<uint64_t>& sizes,
                const std::vector<int>& servers, const Options& defaults) {
  for (int s : servers)
    for (uint64_t size : sizes)
      for (const auto& c : types) {
        const uint64_t b = wire_bytes(c, size, s, defaults);
        std::printf(
            "wire %s %ds size %llu: %llu bytes per worker per pushpull (push %llu + "
            "pull %llu); = %.4f of none's\n",
            std::string(compress::type_name(c.type)).c_str(), s,
            static_cast<unsigned long long>(size), static_cast<unsigned long long>(b),
            static_cast<unsigned long long>(b / 2), static_cast<unsigned long long>(b / 2),
            static_cast<double>(b) / static_cast<double>(2 * size));
      }
}

void run_netns(const Settings& st) {
  PsNetnsArgs a;
  a.hosts = st.netns;
  a.rate = st.rate;
  a.sizes = parse_sizes(st.sizes);
  a.iters = st.iters;
  std::vector<compress::Settings> types = parse_compression(st.compression);
  for (const auto& t : types)
    a.compressions.emplace_back(compress::type_name(t.type));
  double goodput = 0;
  auto rows = run_ps_netns(a, &goodput);
  BenchTable table(st.flags);
  for (const auto& r : rows) {
    double gbps = 2.0 * static_cast<double>(r.bytes) / (r.median_us * 1e-6) / 1e9;
    table.add({fmt::format("pushpull_{}s_{}", a.hosts, r.compression), a.hosts, r.bytes,
               r.median_us, gbps, gbps});
  }
  table.print(fmt::format(
      "Parameter server push+pull per worker, {} network-namespace hosts (a server and a worker "
      "each), links shaped to {} (iperf3 goodput {:.3f} Gbit/s); GB/s = 2 x size / time",
      a.hosts, a.rate.empty() ? "nothing" : a.rate, goodput / 1e9));
  if (!st.flags.csv()) print_wire(types, a.sizes, {a.hosts}, Options{});
}

void run(const Settings& st) {
  set_log_level(LogLevel::kWarning);
  if (st.ps_node) {
    std::vector<std::string> comps;
    for (const auto& t : parse_compression(st.compression))
      comps.emplace_back(compress::type_name(t.type));
    run_ps_node(parse_sizes(st.sizes), comps, st.iters, st.ps_out);
    return;
  }
  if (st.netns > 0) return run_netns(st);
  BenchTable table(st.flags);
  std::vector<uint64_t> sizes = parse_sizes(st.sizes);
  const std::vector<compress::Settings> types = parse_compression(st.compression);
  const Options defaults;
  std::vector<int> replica_list{-1};
  if (!st.replicas.empty()) replica_list = parse_ints(st.replicas);
  std::vector<int> transports{-1};  // -1 default, 0 tcp, 1 shm
  if (!st.transport.empty()) {
    transports.clear();
    for (const auto& t : split_list(st.transport))
      transports.push_back(t == "shm" ? 1 : 0);
  }
  const int rounds = std::max(1, st.repeats);
  for (int s : parse_ints(st.servers)) {
    for (int w : parse_ints(st.workers)) {
      // secs[r][t][round][type][size], rounds interleaved so every setting
      // sees the same load.
      std::vector<std::vector<std::vector<std::vector<std::vector<double>>>>> secs(
          replica_list.size(),
          std::vector<std::vector<std::vector<std::vector<double>>>>(transports.size()));
      for (int round = 0; round < rounds; ++round)
        for (size_t r = 0; r < replica_list.size(); ++r)
          for (size_t t = 0; t < transports.size(); ++t)
            secs[r][t].push_back(
                measure(w, s, sizes, st.iters, types, replica_list[r], transports[t]));
      // The median over rounds of each setting, type and size.
      auto med = [&](size_t r, size_t t, size_t type, size_t i) {
        std::vector<double> v;
        for (const auto& one : secs[r][t])
          v.push_back(one[type][i]);
        return median(v);
      };
      for (size_t r = 0; r < replica_list.size(); ++r)
        for (size_t t = 0; t < transports.size(); ++t)
          for (size_t type = 0; type < types.size(); ++type)
            for (size_t i = 0; i < sizes.size(); ++i) {
              const double m = med(r, t, type, i);
              double gbps = 2.0 * static_cast<double>(sizes[i]) / m / 1e9;
              std::string impl = fmt::format("pushpull_{}s", s);
              if (types.size() > 1 || types[type].enabled())
                impl += fmt::format("_{}", compress::type_name(types[type].type));
              if (replica_list[r] >= 0) impl += fmt::format("_r{}", replica_list[r]);
              if (transports[t] >= 0) impl += transports[t] == 1 ? "_shm" : "_tcp";
              table.add({impl, w, sizes[i], m * 1e6, gbps, gbps});
            }
      if (st.flags.csv()) continue;
      // Ratios of medians, same run: shm over tcp, replicas over the first.
      for (size_t i = 0; i < sizes.size(); ++i) {
        for (size_t r = 0; r < replica_list.size(); ++r)
          for (size_t t = 1; t < transports.size(); ++t)
            std::printf("ratio %dw x %ds size %llu%s: %s is %.2fx as fast as %s\n", w, s,
                        static_cast<unsigned long long>(sizes[i]),
                        replica_list[r] >= 0 ? fmt::format(" r{}", replica_list[r]).c_str() : "",
                        transports[t] == 1 ? "shm" : "tcp", med(r, 0, 0, i) / med(r, t, 0, i),
                        transports[0] == 1 ? "shm" : "tcp");
        for (size_t t = 0; t < transports.size(); ++t)
          for (size_t r = 1; r < replica_list.size(); ++r)
            std::printf(
                "ratio %dw x %ds size %llu%s: replicas %d takes %.2fx the time of "
                "replicas %d\n",
                w, s, static_cast<unsigned long long>(sizes[i]),
                transports[t] >= 0 ? (transports[t] == 1 ? " shm" : " tcp") : "", replica_list[r],
                med(r, t, 0, i) / med(0, t, 0, i), replica_list[0]);
      }
    }
  }
  if (types.size() > 1 || types[0].enabled())
    print_wire(types, sizes, parse_ints(st.servers), defaults);
  if (st.flags.peers()) {
    std::vector<double> rates;
    double moved = 0, took = 0;
    for (int i = 0; i < 3; ++i)
      if (auto r = iperf3_once(st.iperf_seconds)) {
        rates.push_back(r->first / r->second / 1e9);
        moved = r->first;
        took = r->second;
      }
    if (rates.empty()) {
      std::fprintf(stderr, "iperf3 did not run (is it installed?); no ceiling figure\n");
    } else {
      double gbps = median(rates);
      table.add({"iperf3", 1, static_cast<uint64_t>(moved), took * 1e6, gbps, gbps});
    }
  }
  table.print(
      "Parameter server push+pull per worker (GB/s = 2 x size / time; impl pushpull_Ks = K "
      "servers; n = workers)");
}

}  // namespace

void register_bench_ps(CLI::App& bench) {
  auto settings = std::make_shared<Settings>();
  auto* cmd = bench.add_subcommand("ps", "Parameter-server push+pull throughput vs iperf3");
  add_bench_flags(cmd, &settings->flags);
  cmd->add_option("-n,--workers", settings->workers, "Numbers of workers, e.g. 1,2");
  cmd->add_option("-s,--servers", settings->servers, "Numbers of servers, e.g. 1,2");
  cmd->add_option("--sizes", settings->sizes, "Array sizes in bytes, e.g. 4K..64M");
  cmd->add_option("--iters", settings->iters, "Timed iterations per size (median reported)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--replicas", settings->replicas,
                  "Backups per key range to compare, e.g. 0,1 (PUSHPULL_PS_REPLICAS; needs at "
                  "least 2 servers)");
  cmd->add_option("--transport", settings->transport,
                  "Payload paths to compare on this host, e.g. tcp,shm (PUSHPULL_PS_SHM); "
                  "interleaved with --repeats")
      ->check([](const std::string& v) {
        for (const auto& t : split_list(v))
          if (t != "tcp" && t != "shm") return std::string("transports are tcp and shm");
        return std::string();
      });
  cmd->add_option("--compression", settings->compression,
                  "Gradient compressions to time, e.g. none,fp16,2bit,1bit")
      ->check([](const std::string& v) {
        try {
          parse_compression(v);
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
        return std::string();
      });
  cmd->add_flag("--ps-node", settings->ps_node)->group("");  // internal
  cmd->add_option("--ps-out", settings->ps_out)->group("");
  cmd->add_option("--iperf-seconds", settings->iperf_seconds, "Length of each iperf3 run")
      ->check(CLI::Range(1, 60));
  cmd->add_option("--netns", settings->netns,
                  "Workers on H network-namespace hosts with links shaped to --rate (needs "
                  "root); -n is ignored. See --placement")
      ->check(CLI::Range(0, 16));
  cmd->add_option("--placement", settings->placement,
                  "With --netns: 'dedicated' (each server on a host of its own, -s counts, next "
                  "to the ring allreduce), 'colocated' (a server and a worker per host, every "
                  "--compression interleaved), 'hybrid' (-s spare server hosts plus a server on "
                  "every worker host, BytePS's split) or 'dedicated,hybrid' (both, interleaved)")
      ->check(CLI::IsMember({"dedicated", "colocated", "hybrid", "dedicated,hybrid"}))
      ->capture_default_str();
  cmd->add_option("--rate", settings->rate,
                  "With --netns: tc tbf rate of every link ('' = unshaped)")
      ->capture_default_str();
  cmd->add_option("--queue-ms", settings->queue_ms,
                  "With --netns: tbf latency, the longest a packet queues at a port")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--repeats", settings->repeats,
                  "Interleaved runs of every --replicas/--transport job (and with --netns); "
                  "rows are medians")
      ->check(CLI::Range(1, 100));
  cmd->callback([settings, cmd] {
    if (settings->netns > 0 && settings->placement != "colocated" && !settings->ps_node) {
      if (settings->compression != "none")
        throw CLI::ValidationError("--compression",
                                   "with --netns, compression rows need --placement colocated");
      PsNetnsSettings p;
      p.workers = settings->netns;
      p.servers.clear();
      for (int s : parse_ints(cmd->count("--servers") ? settings->servers : "1,2,4,8"))
        p.servers.push_back(s);
      p.rate = settings->rate;
      p.queue_ms = settings->queue_ms;
      p.iters = cmd->count("--iters") ? settings->iters : 5;
      p.repeats = settings->repeats;
      p.ring = settings->flags.peers();
      p.dedicated = settings->placement.find("dedicated") != std::string::npos;
      p.hybrid = settings->placement.find("hybrid") != std::string::npos;
      // One setting per study: the first of --replicas, else 0 (bench_scaling.h).
      if (!settings->replicas.empty()) p.ps_replicas = parse_ints(settings->replicas).front();
      p.csv = settings->flags.csv();
      for (uint64_t b : parse_sizes(cmd->count("--sizes") ? settings->sizes : "40M")) {
        p.bytes = b;
        run_ps_netns(p);
      }
      return;
    }
    run(*settings);
  });
}

}  // namespace pushpull::cli
