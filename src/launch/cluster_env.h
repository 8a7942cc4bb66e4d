// SPDX-License-Identifier: Apache-2.0
// What a cluster manager tells the per-node launcher (`pushpull launch
// --nproc-per-node P`, docs/launch.md "Slurm" and "Kubernetes"): the number
// of nodes, this node's index, where node 0 is, read from the variables the
// manager gives a pod or a task. Sources, the first one present wins:
//
//   kubeflow  Kubeflow Trainer's torch runtime (TrainJob/JobSet): PET_NNODES,
//             PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,
//             PET_MASTER_PORT. PyTorchJob: MASTER_ADDR, MASTER_PORT, RANK
//             (the pod's index), WORLD_SIZE (pods, or pods x
//             PET_NPROC_PER_NODE when the operator sets that) and the PET_*
//             ones it sets. PET_* win over the plain names.
//   slurm     one task per node under srun: SLURM_JOB_NUM_NODES (or
//             SLURM_NNODES), SLURM_NODEID, node 0 = the first host of
//             SLURM_JOB_NODELIST; the port is derived from SLURM_JOB_ID.
//   mpi       one process per node under Open MPI's mpirun (Kubeflow
//             MPIJob): OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK; node 0 =
//             MASTER_ADDR when mpirun forwards it (-x), else the first host
//             of the hostfile OMPI_MCA_orte_default_hostfile names (MPIJob:
//             /etc/mpi/hostfile, on the launcher pod); MASTER_PORT likewise.
//
// Thread safety: pure functions over values (the hostfile is read by the
// caller's `read`).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "pushpull/options.h"

namespace pushpull::launch {

struct ClusterNodeEnv {
  std::string source;  // "kubeflow", "slurm", "mpi"; "" when none is present
  int nnodes = 0;      // 0: not given
  int node_rank = -1;  // -1: not given
  int nproc_per_node = 0;
  std::string master_addr;
  int master_port = 0;
};

// The default rendezvous port of the per-node mode when nothing names one
// (torchrun's).
inline constexpr int kDefaultMasterPort = 29500;

// Reads the variables above from `env`; `read(path)` returns a file's text
// (nullopt: unreadable). Throws InvalidArgument naming the variable when a
// value is malformed, an elastic range (PET_NNODES=1:4) is given, or more
// than one task runs per node (srun/mpirun must start one launcher per node).
ClusterNodeEnv cluster_node_env(
    const Environment& env,
    const std::function<std::optional<std::string>(const std::string&)>& read);

// The first host of a Slurm host list: "n[1-2,5],gpu3" -> "n1".
std::string first_slurm_host(std::string_view nodelist);

}  // namespace pushpull::launch
