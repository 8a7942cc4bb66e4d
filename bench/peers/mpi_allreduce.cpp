// SPDX-License-Identifier: Apache-2.0
// Peer driver: Open MPI's MPI_Allreduce (float sum, in place), timed as in
// common.h. Run under mpirun; the transport is chosen by mpirun's --mca flags.
//   mpirun -n 4 pp_mpi_allreduce --sizes 4096,67108864 --iters 50,5
#include <mpi.h>

#include "common.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  peers::Args args;
  if (!peers::parse(argc, argv, 1, &args)) {
    if (rank == 0) std::fprintf(stderr, "usage: %s --sizes B,B.. --iters K[,K..]\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  for (size_t s = 0; s < args.sizes.size(); ++s) {
    size_t count = std::max<uint64_t>(1, args.sizes[s] / 4);
    std::vector<float> buf(count, static_cast<float>(rank));
    std::vector<double> us;
    for (int it = 0; it < args.warmup + args.iters[s]; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      double t1 = MPI_Wtime();
      if (it >= args.warmup) us.push_back((t1 - t0) * 1e6);
    }
    std::vector<double> mx(us.size());
    MPI_Reduce(us.data(), mx.data(), static_cast<int>(us.size()), MPI_DOUBLE, MPI_MAX, 0,
               MPI_COMM_WORLD);
    if (rank == 0) peers::print_result(args.sizes[s], mx);
  }
  MPI_Finalize();
  return 0;
}
