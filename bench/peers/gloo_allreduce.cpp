// SPDX-License-Identifier: Apache-2.0
// Peer driver: Gloo's ring allreduce (float sum, in place) over Gloo's TCP
// transport on loopback, rendezvous through a FileStore directory; timed as
// in common.h. Started once per rank by the benchmark:
//   pp_gloo_allreduce RANK SIZE STORE_DIR --sizes 4096,67108864 --iters 50,5 [--host IP]
#include <chrono>
#include <memory>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "common.h"

int main(int argc, char** argv) {
  peers::Args args;
  if (argc < 4 || !peers::parse(argc, argv, 4, &args)) {
    std::fprintf(stderr, "usage: %s RANK SIZE STORE_DIR --sizes B,B.. --iters K[,K..]\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]);
  try {
    gloo::rendezvous::FileStore store(argv[3]);
    gloo::transport::tcp::attr attr(args.host.c_str());
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(std::chrono::seconds(120));
    ctx->connectFullMesh(store, dev);
    uint32_t tag = 0;
    using clock = std::chrono::steady_clock;
    for (size_t s = 0; s < args.sizes.size(); ++s) {
      size_t count = std::max<uint64_t>(1, args.sizes[s] / 4);
      std::vector<float> buf(count, static_cast<float>(rank));
      std::vector<double> us;
      for (int it = 0; it < args.warmup + args.iters[s]; ++it) {
        gloo::BarrierOptions b(ctx);
        b.setTag(++tag);
        gloo::barrier(b);
        gloo::AllreduceOptions o(ctx);
        o.setOutput(buf.data(), count);
        o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        o.setReduceFunction([](void* a, const void* b, const void* c, size_t n) {
          auto* out = static_cast<float*>(a);
          auto* x = static_cast<const float*>(b);
          auto* y = static_cast<const float*>(c);
          for (size_t i = 0; i < n; ++i)
            out[i] = x[i] + y[i];
        });
        o.setTag(++tag);
        auto t0 = clock::now();
        gloo::allreduce(o);
        auto t1 = clock::now();
        if (it >= args.warmup)
          us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      // Slowest rank per iteration: a max-reduction of the times.
      gloo::AllreduceOptions o(ctx);
      o.setOutput(us.data(), us.size());
      o.setReduceFunction([](void* a, const void* b, const void* c, size_t n) {
        auto* out = static_cast<double*>(a);
        auto* x = static_cast<const double*>(b);
        auto* y = static_cast<const double*>(c);
        for (size_t i = 0; i < n; ++i)
          out[i] = std::max(x[i], y[i]);
      });
      o.setTag(++tag);
      gloo::allreduce(o);
      if (rank == 0) peers::print_result(args.sizes[s], us);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo driver rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
