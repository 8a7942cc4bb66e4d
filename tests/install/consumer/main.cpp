// SPDX-License-Identifier: Apache-2.0
// A program outside the pushpull tree, built against an installed pushpull
// (find_package, pkg-config, the .deb) or a vendored one (add_subdirectory):
// a local KVStore round with an optimizer, checked against the closed form.
#include <cstdio>
#include <cstring>

#include "pushpull/build_info.h"
#include "pushpull/kvstore.h"

int main() {
  using namespace pushpull;
  auto kv = create_kvstore("local", Options{});
  Array w = Array::full(Shape{2, 3}, 1.0);
  kv->init("weight", w);
  kv->set_optimizer(OptimizerSpec::parse("sgd:learning_rate=0.1"));
  Array g0 = Array::full(Shape{2, 3}, 1.0), g1 = Array::full(Shape{2, 3}, 2.0);
  kv->push("weight", ArrayList{g0, g1});  // gradient 3: w = 1 - 0.1 * 3 = 0.7
  kv->pull("weight", w.view());
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double got = get_element(w.view(), i);
    if (got < 0.7 - 1e-6 || got > 0.7 + 1e-6) {
      std::fprintf(stderr, "consumer: element %lld is %f, want 0.7\n", static_cast<long long>(i),
                   got);
      return 1;
    }
  }
  std::printf("consumer ok: pushpull %s\n", PUSHPULL_VERSION);
  return 0;
}
