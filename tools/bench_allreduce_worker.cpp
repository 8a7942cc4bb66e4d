// SPDX-License-Identifier: Apache-2.0
// One pushpull rank of `pushpull bench allreduce`, started by the benchmark
// as `pushpull bench allreduce --worker-rank R --worker-size N --rendezvous
// DIR ...` (one process per rank, as the peers run).
//
// Rendezvous: each rank listens on a free port of its host (loopback, or its
// namespace's address) and publishes "host port" as DIR/<rank> (written then renamed, so readers
// never see half a file); it waits for every rank's file, then TcpTransport::connect_all. Timing
// matches bench/peers/common.h: per iteration a barrier, then the allreduce (float32 sum, in place)
// timed on every rank; the slowest rank's time per iteration (a max-allreduce of the times after
// the loop); rank 0 prints "result <bytes> <median_us>" per size.
//
// With --worker-transport shm the ranks take the path of a job's ranks on one
// host: the TCP mesh with collective data through shared memory
// (use_shared_memory, shm_data_transport.h). With --worker-algo hier the allreduce is the
// hierarchical one (collective/hierarchical.h), the ranks grouped by the address they published
// (one per network namespace).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "bench_allreduce.h"
#include "bench_allreduce_rs.h"
#include "bench_common.h"
#include "collective/algorithms.h"
#include "collective/hierarchical.h"
#include "compress/compressor.h"
#include "compress/gathered.h"
#include "pushpull/options.h"
#include "transport/shm/shm_data_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::pair<std::string, int>> rendezvous(const std::string& dir, int rank, int size,
                                                    const std::string& host, int port,
                                                    Millis timeout) {
  namespace fs = std::filesystem;
  {
    std::ofstream f(fmt::format("{}/{}.tmp", dir, rank));
    f << host << " " << port << "\n";
  }
  fs::rename(fmt::format("{}/{}.tmp", dir, rank), fmt::format("{}/{}", dir, rank));
  std::vector<std::pair<std::string, int>> book(static_cast<size_t>(size));
  const auto deadline = Clock::now() + timeout;
  for (int r = 0; r < size; ++r) {
    while (true) {
      std::ifstream f(fmt::format("{}/{}", dir, r));
      std::string h;
      int p = 0;
      if (f >> h >> p && p > 0) {
        book[static_cast<size_t>(r)] = {h, p};
        break;
      }
      if (Clock::now() > deadline)
        throw Timeout(
            fmt::format("bench worker {}: rank {} never published its port in {}", rank, r, dir));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return book;
}

// Rank r's gradient is r everywhere. After the first allreduce every element
// is 0 + 1 + ... + (n-1), or with 1bit/2bit the sum of what each rank's
// first code says (zero residuals: r - t > 0 for 1bit, r >= t for 2bit): a
// fast but wrong run must not produce figures.
// `requantised` (the _rs rows): the owner re-encodes that sum, so the
// result is the code of the sum.
float first_code(const compress::Settings& comp, float g) {
  if (comp.type == compress::Type::k1Bit) return g > comp.threshold ? 1.0f : -1.0f;
  if (comp.type == compress::Type::k2Bit)
    return g >= comp.threshold ? comp.threshold : (g <= -comp.threshold ? -comp.threshold : 0.0f);
  return g;
}

void check_sum(const std::vector<float>& buf, int n, const compress::Settings& comp,
               bool requantised) {
  float want = 0;
  for (int r = 0; r < n; ++r)
    want += first_code(comp, static_cast<float>(r));
  if (requantised) want = first_code(comp, want);
  for (size_t i : {size_t{0}, buf.size() / 2, buf.size() - 1})
    if (buf[i] != want)
      throw Internal(
          fmt::format("bench allreduce: element {} is {} after the first allreduce of "
                      "{} floats over {} ranks ({}), expected {}",
                      i, buf[i], buf.size(), n, comp.to_string(), want));
}

// 1bit/2bit: the ranks' codes side by side in `all` (rank r's block at r *
// part bytes, its own already there), gathered round the ring, then summed
// in rank order into out, as dist_sync_allreduce does.
void gather_and_sum(collective::AlgoContext& ctx, const compress::Codec& codec,
                    std::vector<std::byte>& all, size_t part, size_t count, float* out) {
  const int n = ctx.size();
  std::vector<transport::Block> blocks;
  std::vector<const std::byte*> parts;
  for (int r = 0; r < n; ++r) {
    blocks.push_back({static_cast<size_t>(r) * part, part});
    parts.push_back(all.data() + static_cast<size_t>(r) * part);
  }
  collective::ring(ctx, all.data(), DType::kUInt8, ReduceOp::kSum, blocks, false, true);
  compress::sum_in_rank_order(codec, parts, count, out);
}

}  // namespace

int run_allreduce_worker(const WorkerArgs& a) {
  Options opts = Options::from_env();
  opts.net.connect_timeout = Millis(30000);
  std::unique_ptr<transport::Transport> transport;
  std::vector<std::pair<std::string, int>> book;
  {
    auto tcp = std::make_unique<transport::TcpTransport>(a.rank, a.size, opts.net, a.host, 0);
    book = rendezvous(a.rendezvous_dir, a.rank, a.size, a.host, tcp->port(), Millis(30000));
    tcp->connect_all(book);
    if (a.transport == "shm") {
      // What a job's ranks on one host get (bootstrap.cpp): the TCP mesh,
      // data through shared memory, operations of small messages on the
      // mesh's direct streams (PUSHPULL_SHM_MIN_MESSAGE_BYTES).
      CollectiveOptions c = opts.collective;
      c.shared_memory = true;
      transport = transport::use_shared_memory(std::move(tcp), c, Millis(30000), "/dev/shm");
    } else {
      transport = std::move(tcp);
    }
  }
  // --worker-algo hier: the hosts are the book's addresses (one per namespace).
  std::optional<collective::Hierarchy> hierarchy;
  if (a.algo == "hier") {
    std::vector<std::string> hosts;
    for (const auto& [h, p] : book)
      hosts.push_back(h);
    std::string note;
    hierarchy = collective::choose_hierarchy(hosts, a.rank, 1, &note);
    if (!hierarchy)
      throw InvalidArgument("bench allreduce: no hierarchical allreduce here: " + note);
  }
  transport::Transport& t = *transport;

  std::vector<char> scratch;
  collective::AlgoContext ctx{t};
  ctx.peer_timeout = Millis(60000);
  ctx.ring_segment_bytes = opts.collective.ring_segment_bytes;
  ctx.small_allreduce_bytes = opts.collective.small_allreduce_bytes;
  ctx.scratch = &scratch;
  uint64_t op_id = 0;
  // "1bit_rs" / "2bit_rs": the compressed reduce-scatter (bench_allreduce_rs.h).
  const bool rs = a.compression.ends_with("_rs");
  const compress::Settings comp = compress::parse_settings(
      {{"type", rs ? a.compression.substr(0, a.compression.size() - 3) : a.compression}});
  if (rs && !comp.quantises())
    throw InvalidArgument("bench allreduce: only 2bit_rs and 1bit_rs reduce-scatter codes");
  for (size_t s = 0; s < a.sizes.size(); ++s) {
    const size_t count = std::max<uint64_t>(1, a.sizes[s] / 4);
    std::vector<float> buf(count, static_cast<float>(a.rank));
    // fp16: what travels, and the gradient it is made from each iteration.
    const std::vector<float> grad(comp.enabled() ? count : 0, static_cast<float>(a.rank));
    std::vector<uint16_t> half(comp.enabled() && !comp.quantises() ? count : 0);
    std::unique_ptr<compress::Compressor> compressor;
    if (comp.enabled()) compressor = std::make_unique<compress::Compressor>(comp);
    // 1bit/2bit: every rank's codes, this rank's written in place.
    const size_t part = compressor ? compressor->codec().compressed_bytes(count) : 0;
    std::vector<std::byte> codes(comp.quantises() && !rs ? part * static_cast<size_t>(a.size) : 0);
    std::unique_ptr<RsCodes> rs_codes;
    if (rs) rs_codes = std::make_unique<RsCodes>(comp, count, a.size, a.rank);
    std::byte* my_codes = codes.data() + part * static_cast<size_t>(a.rank);
    std::vector<double> us;
    for (int it = 0; it < a.warmup + a.iters[s]; ++it) {
      ctx.op_id = ++op_id;
      collective::barrier(ctx);
      ctx.op_id = ++op_id;
      auto t0 = Clock::now();
      if (rs_codes) {
        rs_codes->run(ctx, op_id, grad.data(), buf.data());
      } else if (comp.quantises()) {
        compressor->encode_raw(0, 0, count, 0, grad.data(), count, my_codes);
        gather_and_sum(ctx, compressor->codec(), codes, part, count, buf.data());
      } else if (compressor) {
        compressor->encode_raw(0, 0, count, 0, grad.data(), count,
                               reinterpret_cast<std::byte*>(half.data()));
        collective::allreduce(ctx, half.data(), count, DType::kFloat16, ReduceOp::kSum);
        half_to_float(half.data(), buf.data(), count);
      } else {
        collective::allreduce_via(ctx, hierarchy ? &*hierarchy : nullptr, buf.data(), count,
                                  DType::kFloat32, ReduceOp::kSum);
      }
      auto t1 = Clock::now();
      if (it >= a.warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      if (it == 0) check_sum(buf, a.size, comp, rs);
    }
    ctx.op_id = ++op_id;
    collective::allreduce(ctx, us.data(), us.size(), DType::kFloat64, ReduceOp::kMax);
    if (a.rank == 0) {
      std::printf("result %llu %.3f\n", static_cast<unsigned long long>(a.sizes[s]), median(us));
      std::fflush(stdout);
    }
  }
  t.close(Status(ErrorCode::kPeerFailure, "benchmark done"));
  return 0;
}

}  // namespace pushpull::cli
