// SPDX-License-Identifier: Apache-2.0
// A libtorch program outside the tree built against an installed pushpull
// with find_package(pushpull COMPONENTS torch): pushpull::torch links.
#include <atomic>
#include <cstdio>

#include <torch/torch.h>

#include "pushpull/torch/replicas.h"

int main() {
  pushpull::torch::ReplicaRunner runner(2);
  std::atomic<int> sum{0};
  runner.run([&](int device) { sum += device + 1; });
  const auto t = torch::ones({2}) * sum.load();
  if (t[0].item<float>() != 3.0f) return 1;
  std::printf("consumer torch ok\n");
  return 0;
}
