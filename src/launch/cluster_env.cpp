// SPDX-License-Identifier: Apache-2.0
#include "launch/cluster_env.h"

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "launch/hostfile.h"
#include "pushpull/error.h"

namespace pushpull::launch {
namespace {

std::optional<int> integer(const Environment& env, std::string_view name) {
  auto v = env.get(name);
  if (!v || v->empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v->c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || n < 0 || n > 1000000) {
    if (name == "PET_NNODES" && v->find(':') != std::string::npos)
      throw InvalidArgument(fmt::format(
          "PET_NNODES={} is an elastic range: the per-node mode needs a fixed number of nodes "
          "(for an elastic job see docs/launch.md, \"Kubernetes\")",
          *v));
    throw InvalidArgument(fmt::format("{}='{}' is not a number", name, *v));
  }
  return static_cast<int>(n);
}

std::string text(const Environment& env, std::string_view name) {
  return env.get(name).value_or("");
}

ClusterNodeEnv from_kubeflow(const Environment& env) {
  ClusterNodeEnv n;
  n.source = "kubeflow";
  n.nproc_per_node = integer(env, "PET_NPROC_PER_NODE").value_or(0);
  if (auto v = integer(env, "PET_NNODES")) {
    n.nnodes = *v;
  } else if (auto ws = integer(env, "WORLD_SIZE")) {
    // PyTorchJob: WORLD_SIZE counts pods, or pods x processes when the
    // operator also sets PET_NPROC_PER_NODE.
    n.nnodes = n.nproc_per_node > 0 ? *ws / n.nproc_per_node : *ws;
  }
  n.node_rank = integer(env, "PET_NODE_RANK").value_or(integer(env, "RANK").value_or(-1));
  n.master_addr = text(env, "PET_MASTER_ADDR");
  if (n.master_addr.empty()) n.master_addr = text(env, "MASTER_ADDR");
  n.master_port = integer(env, "PET_MASTER_PORT").value_or(integer(env, "MASTER_PORT").value_or(0));
  return n;
}

ClusterNodeEnv from_slurm(const Environment& env) {
  ClusterNodeEnv n;
  n.source = "slurm";
  auto nodes = integer(env, "SLURM_JOB_NUM_NODES");
  if (!nodes) nodes = integer(env, "SLURM_NNODES");
  n.nnodes = nodes.value_or(0);
  n.node_rank = integer(env, "SLURM_NODEID").value_or(-1);
  auto tasks = integer(env, "SLURM_STEP_NUM_TASKS");
  auto step_nodes = integer(env, "SLURM_STEP_NUM_NODES");
  // The batch script itself runs on the first node only: the other nodes'
  // launchers would never start.
  if (!step_nodes && n.nnodes > 1)
    throw InvalidArgument(fmt::format(
        "this is the batch script of a {}-node Slurm job, which runs on its first node only: "
        "start the per-node launcher on every node with srun --ntasks-per-node=1 (see "
        "examples/slurm/pushpull-per-node.sbatch), or use --launcher slurm -n N",
        n.nnodes));
  if (tasks && step_nodes && *tasks != *step_nodes)
    throw InvalidArgument(fmt::format(
        "srun started {} tasks on {} nodes: the per-node mode needs one launcher per node (srun "
        "--ntasks-per-node=1)",
        *tasks, *step_nodes));
  if (step_nodes && nodes && *step_nodes != *nodes)
    throw InvalidArgument(fmt::format(
        "this srun step spans {} of the job's {} nodes: run the per-node launcher on every node "
        "(srun --nodes={} --ntasks-per-node=1)",
        *step_nodes, *nodes, *nodes));
  std::string list = text(env, "SLURM_JOB_NODELIST");
  if (list.empty()) list = text(env, "SLURM_NODELIST");
  if (!list.empty()) n.master_addr = first_slurm_host(list);
  // A port per job, the same on every node: two jobs sharing a node differ.
  if (auto id = integer(env, "SLURM_JOB_ID")) n.master_port = 20000 + *id % 12000;
  return n;
}

ClusterNodeEnv from_mpi(const Environment& env,
                        const std::function<std::optional<std::string>(const std::string&)>& read) {
  ClusterNodeEnv n;
  n.source = "mpi";
  n.nnodes = integer(env, "OMPI_COMM_WORLD_SIZE").value_or(0);
  n.node_rank = integer(env, "OMPI_COMM_WORLD_RANK").value_or(-1);
  if (auto local = integer(env, "OMPI_COMM_WORLD_LOCAL_SIZE"); local && *local > 1)
    throw InvalidArgument(fmt::format(
        "mpirun started {} processes on this node: the per-node mode needs one launcher per node "
        "(mpirun --npernode 1 or --map-by ppr:1:node)",
        *local));
  // Node 0: MASTER_ADDR when mpirun forwards one (-x MASTER_ADDR=...), else
  // the first host of the hostfile (where mpirun started rank 0).
  n.master_addr = text(env, "MASTER_ADDR");
  n.master_port = integer(env, "MASTER_PORT").value_or(0);
  const std::string path = text(env, "OMPI_MCA_orte_default_hostfile");
  if (!n.master_addr.empty() || path.empty()) return n;
  auto body = read(path);
  if (!body)
    throw InvalidArgument(
        fmt::format("OMPI_MCA_orte_default_hostfile={}: cannot read the hostfile (or pass "
                    "-x MASTER_ADDR=<node 0> to mpirun)",
                    path));
  auto hosts = parse_hostfile(*body, path);
  if (!hosts.empty()) n.master_addr = hosts.front().host;
  return n;
}

}  // namespace

ClusterNodeEnv cluster_node_env(
    const Environment& env,
    const std::function<std::optional<std::string>(const std::string&)>& read) {
  if (env.first({"PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR"}) ||
      (env.get("MASTER_ADDR") && env.get("RANK") && env.get("WORLD_SIZE")))
    return from_kubeflow(env);
  if (env.get("SLURM_NODEID") && env.get("SLURM_JOB_ID")) return from_slurm(env);
  if (env.get("OMPI_COMM_WORLD_RANK") && env.get("OMPI_COMM_WORLD_SIZE"))
    return from_mpi(env, read);
  return {};
}

std::string first_slurm_host(std::string_view list) {
  // The first entry: up to a comma outside brackets.
  size_t depth = 0, end = 0;
  for (; end < list.size(); ++end) {
    if (list[end] == '[') ++depth;
    if (list[end] == ']' && depth > 0) --depth;
    if (list[end] == ',' && depth == 0) break;
  }
  std::string_view entry = list.substr(0, end);
  auto open = entry.find('[');
  if (open == std::string_view::npos) return std::string(entry);
  // prefix[range,...]suffix: the first number of the first range, zeros kept.
  std::string_view inside = entry.substr(open + 1);
  size_t stop = inside.find_first_of("-,]");
  std::string_view first = inside.substr(0, stop);
  auto close = entry.find(']', open);
  std::string_view suffix =
      close == std::string_view::npos ? std::string_view() : entry.substr(close + 1);
  return fmt::format("{}{}{}", entry.substr(0, open), first, suffix);
}

}  // namespace pushpull::launch
