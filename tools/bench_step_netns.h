// SPDX-License-Identifier: Apache-2.0
// `pushpull bench step --netns H`: the DDP step of `bench step` with one rank
// per network-namespace host (NetnsLab, links shaped with tc tbf), DDP over
// gloo next to DDP over the `pushpull` torch.distributed backend, interleaved
// in the same run. The ranks are started the way torchrun would start them on
// H machines (RANK, WORLD_SIZE, MASTER_ADDR = host 0's address, a fresh job
// secret in the environment), not by `pushpull launch`, which runs one host.
// Thread safety: none (a CLI command).
#pragma once

#include <string>
#include <vector>

namespace pushpull::cli {

struct StepNetnsArgs {
  int hosts = 2;
  std::string rate;                // tc rate of every link ("1gbit"); empty: unshaped
  std::vector<std::string> impls;  // ddp-gloo, ddp-pushpull
  std::vector<double> grad_mb;
  int layers = 8, batch = 4, steps = 15, warmup = 3, repeats = 3, timeout_s = 600;
  std::string python;
  bool csv = false;
};

// Makes the namespaces, runs every (size, repeat, impl) and prints a row per
// impl and size: the median over the repeats of rank 0's median step, and
// that over ddp-gloo's. Throws InvalidArgument for an impl it cannot run
// across hosts, IoError when the namespaces cannot be made (needs root).
void run_step_netns(const StepNetnsArgs& a);

}  // namespace pushpull::cli
