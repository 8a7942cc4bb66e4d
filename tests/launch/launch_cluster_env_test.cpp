// SPDX-License-Identifier: Apache-2.0
// What cluster managers give the per-node launcher (launch/cluster_env.h:
// Kubeflow TrainJob and PyTorchJob, srun, mpirun), and the address a node
// advertises (transport/address.h: --interface lists and per-host entries, the
// route toward the scheduler). The whole jobs on network-namespace hosts are
// tests/launch/slurm_cluster_test.py and kubernetes_pods_test.py.
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "launch/cluster_env.h"
#include "pushpull/error.h"
#include "support/process.h"
#include "transport/address.h"

namespace {

using pushpull::Environment;
using pushpull::InvalidArgument;
using pushpull::NetOptions;
using pushpull::launch::cluster_node_env;
using pushpull::launch::ClusterNodeEnv;
using pushpull::launch::first_slurm_host;
using pushpull::transport::choose_host;
using pushpull::transport::InterfaceAddress;
using pushpull::transport::pick_interface;

std::optional<std::string> no_file(const std::string&) {
  return std::nullopt;
}

ClusterNodeEnv read(std::map<std::string, std::string> vars,
                    std::map<std::string, std::string> files = {}) {
  return cluster_node_env(Environment(std::move(vars)), [&](const std::string& p) {
    auto it = files.find(p);
    return it == files.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

TEST(ClusterEnv, NothingWithoutAClusterManager) {
  EXPECT_EQ(read({{"HOME", "/root"}}).source, "");
}

TEST(ClusterEnv, KubeflowTrainerTorchRuntime) {
  auto n = read({{"PET_NNODES", "3"},
                 {"PET_NPROC_PER_NODE", "4"},
                 {"PET_NODE_RANK", "2"},
                 {"PET_MASTER_ADDR", "job-node-0-0.job"},
                 {"PET_MASTER_PORT", "29400"}});
  EXPECT_EQ(n.source, "kubeflow");
  EXPECT_EQ(n.nnodes, 3);
  EXPECT_EQ(n.nproc_per_node, 4);
  EXPECT_EQ(n.node_rank, 2);
  EXPECT_EQ(n.master_addr, "job-node-0-0.job");
  EXPECT_EQ(n.master_port, 29400);
  EXPECT_THROW(read({{"PET_NNODES", "1:4"}, {"PET_NODE_RANK", "0"}}), InvalidArgument);
}

TEST(ClusterEnv, PyTorchJobWithAndWithoutNprocPerNode) {
  // training-operator with nprocPerNode: WORLD_SIZE counts processes.
  auto n = read({{"MASTER_ADDR", "job-master-0"},
                 {"MASTER_PORT", "23456"},
                 {"WORLD_SIZE", "6"},
                 {"RANK", "1"},
                 {"PET_NPROC_PER_NODE", "2"}});
  EXPECT_EQ(n.nnodes, 3);
  EXPECT_EQ(n.node_rank, 1);
  EXPECT_EQ(n.master_addr, "job-master-0");
  EXPECT_EQ(n.master_port, 23456);
  // Older operators: WORLD_SIZE counts pods.
  auto old = read({{"MASTER_ADDR", "m"}, {"MASTER_PORT", "1"}, {"WORLD_SIZE", "3"}, {"RANK", "2"}});
  EXPECT_EQ(old.nnodes, 3);
  EXPECT_EQ(old.node_rank, 2);
}

TEST(ClusterEnv, SrunOneTaskPerNode) {
  auto n = read({{"SLURM_JOB_ID", "12345"},
                 {"SLURM_JOB_NUM_NODES", "2"},
                 {"SLURM_NODEID", "1"},
                 {"SLURM_STEP_NUM_NODES", "2"},
                 {"SLURM_STEP_NUM_TASKS", "2"},
                 {"SLURM_JOB_NODELIST", "gpu[07-08]"}});
  EXPECT_EQ(n.source, "slurm");
  EXPECT_EQ(n.nnodes, 2);
  EXPECT_EQ(n.node_rank, 1);
  EXPECT_EQ(n.master_addr, "gpu07");
  EXPECT_EQ(n.master_port, 20000 + 12345 % 12000);
  EXPECT_THROW(read({{"SLURM_JOB_ID", "1"},
                     {"SLURM_NODEID", "0"},
                     {"SLURM_STEP_NUM_NODES", "2"},
                     {"SLURM_STEP_NUM_TASKS", "4"}}),
               InvalidArgument);
  // The batch script (no srun step) of a 2-node job: only one node would run.
  EXPECT_THROW(read({{"SLURM_JOB_ID", "1"}, {"SLURM_NODEID", "0"}, {"SLURM_JOB_NUM_NODES", "2"}}),
               InvalidArgument);
  EXPECT_EQ(
      read({{"SLURM_JOB_ID", "1"}, {"SLURM_NODEID", "0"}, {"SLURM_JOB_NUM_NODES", "1"}}).nnodes, 1);
}

TEST(ClusterEnv, SlurmHostLists) {
  EXPECT_EQ(first_slurm_host("n1"), "n1");
  EXPECT_EQ(first_slurm_host("n[1-2]"), "n1");
  EXPECT_EQ(first_slurm_host("n[003,007-9]"), "n003");
  EXPECT_EQ(first_slurm_host("a[2-3]-ib,b1"), "a2-ib");
  EXPECT_EQ(first_slurm_host("big,n[1-4]"), "big");
}

TEST(ClusterEnv, MpirunOnePerNode) {
  const std::map<std::string, std::string> files = {
      {"/etc/mpi/hostfile", "job-worker-0.job.default.svc slots=2\njob-worker-1.job slots=2\n"}};
  auto n = read({{"OMPI_COMM_WORLD_SIZE", "2"},
                 {"OMPI_COMM_WORLD_RANK", "1"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                 {"OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"}},
                files);
  EXPECT_EQ(n.source, "mpi");
  EXPECT_EQ(n.nnodes, 2);
  EXPECT_EQ(n.node_rank, 1);
  EXPECT_EQ(n.master_addr, "job-worker-0.job.default.svc");
  // Forwarded with -x: wins over the hostfile, which a worker pod lacks.
  auto fwd = read({{"OMPI_COMM_WORLD_SIZE", "2"},
                   {"OMPI_COMM_WORLD_RANK", "0"},
                   {"MASTER_ADDR", "node0"},
                   {"MASTER_PORT", "29500"}});
  EXPECT_EQ(fwd.master_addr, "node0");
  EXPECT_EQ(fwd.master_port, 29500);
  EXPECT_THROW(read({{"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_RANK", "0"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
               InvalidArgument);
  EXPECT_THROW(cluster_node_env(Environment({{"OMPI_COMM_WORLD_SIZE", "2"},
                                             {"OMPI_COMM_WORLD_RANK", "0"},
                                             {"OMPI_MCA_orte_default_hostfile", "/nope"}}),
                                no_file),
               InvalidArgument);
}

// ---- the advertised address ----

const std::vector<InterfaceAddress> kInterfaces = {
    {"lo", "127.0.0.1", false, true, true},
    {"docker0", "172.17.0.1", false, false, true},
    {"eth0", "10.0.0.5", false, false, true},
    {"ens5", "10.1.0.7", false, false, true},
};

TEST(Interfaces, AListTakesTheFirstThatExists) {
  EXPECT_EQ(pick_interface("ib0,ens5,eth0", kInterfaces, "h"), "ens5");
  EXPECT_EQ(pick_interface("ib0", kInterfaces, "h"), std::nullopt);
  NetOptions o;
  o.interface = "ib0,eth0";
  EXPECT_EQ(choose_host(o, kInterfaces, "h"), "10.0.0.5");
  o.interface = "ib0,bond0";
  EXPECT_THROW(choose_host(o, kInterfaces, "h"), InvalidArgument);
  for (const char* bad : {"eth0,", ",eth0", "h1:", ":eth0"})
    EXPECT_THROW(pick_interface(bad, kInterfaces, "h"), InvalidArgument) << bad;
}

TEST(Interfaces, PerHostEntries) {
  const std::string spec = "node1:eth0,node2.cluster:ens5";
  EXPECT_EQ(pick_interface(spec, kInterfaces, "node1"), "eth0");
  EXPECT_EQ(pick_interface(spec, kInterfaces, "node1.cluster.local"), "eth0");
  EXPECT_EQ(pick_interface(spec, kInterfaces, "node2"), "ens5");
  EXPECT_EQ(pick_interface(spec, kInterfaces, "node3"), std::nullopt);
  // Mixed: a host's own entry first, then the default for everyone.
  EXPECT_EQ(pick_interface("node2:ens5,eth0", kInterfaces, "node3"), "eth0");
  EXPECT_EQ(pick_interface("node2:ens5,eth0", kInterfaces, "node2"), "ens5");
}

TEST(Interfaces, TheRouteTowardTheSchedulerWinsOverTheFirstAddress) {
  NetOptions o;
  // No route known: the first non-loopback address (docker0 here, wrongly).
  EXPECT_EQ(choose_host(o, kInterfaces, "h", "10.1.0.1", std::nullopt), "172.17.0.1");
  EXPECT_EQ(choose_host(o, kInterfaces, "h", "10.1.0.1", std::string("10.1.0.7")), "10.1.0.7");
  // A loopback scheduler keeps the old rule; an interface or node host wins.
  EXPECT_EQ(choose_host(o, kInterfaces, "h", "127.0.0.1", std::string("127.0.0.1")), "172.17.0.1");
  o.interface = "eth0";
  EXPECT_EQ(choose_host(o, kInterfaces, "h", "10.1.0.1", std::string("10.1.0.7")), "10.0.0.5");
  o.node_host = "1.2.3.4";
  EXPECT_EQ(choose_host(o, kInterfaces, "h", "10.1.0.1", std::string("10.1.0.7")), "1.2.3.4");
}

TEST(Interfaces, RouteSourceOfThisMachine) {
  EXPECT_EQ(pushpull::transport::route_source_address("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(pushpull::transport::route_source_address("no-such-host.invalid"), std::nullopt);
}

// ---- the per-node launcher reads them (dry run of the real binary) ----

std::string dry_run(std::vector<std::string> args, std::map<std::string, std::string> env) {
  args.insert(args.begin(),
              {std::string(PUSHPULL_BIN_DIR) + "/pushpull", "launch", "--dry-run", "-v"});
  env.emplace("PUSHPULL_JOB_SECRET", "s");
  pushpull::test::ChildProcess child(args, env);
  auto rc = child.wait(std::chrono::seconds(60));
  EXPECT_EQ(rc.value_or(-1), 0) << child.output();
  return child.output();
}

TEST(ClusterEnvCli, TrainJobPodNeedsNoOptions) {
  std::string out = dry_run({"-s", "1", "--", "./train"}, {{"PET_NNODES", "2"},
                                                           {"PET_NPROC_PER_NODE", "2"},
                                                           {"PET_NODE_RANK", "1"},
                                                           {"PET_MASTER_ADDR", "127.0.0.1"},
                                                           {"PET_MASTER_PORT", "29400"}});
  for (const char* want :
       {"RANK=2", "RANK=3", "WORLD_SIZE=4", "DMLC_NUM_WORKER=4", "DMLC_NUM_SERVER=2",
        "DMLC_PS_ROOT_PORT=29400", "MASTER_PORT=29401", "server     1"})
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
}

TEST(ClusterEnvCli, SrunTaskNeedsOnlyTheProcessCount) {
  std::string out =
      dry_run({"--nproc-per-node", "2", "--", "./train"}, {{"SLURM_JOB_ID", "77"},
                                                           {"SLURM_JOB_NUM_NODES", "2"},
                                                           {"SLURM_NODEID", "1"},
                                                           {"SLURM_STEP_NUM_NODES", "2"},
                                                           {"SLURM_JOB_NODELIST", "localhost,n2"}});
  for (const char* want : {"RANK=3", "WORLD_SIZE=4", "MASTER_ADDR=localhost", "MASTER_PORT=20077"})
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
}

}  // namespace
