// SPDX-License-Identifier: Apache-2.0
// Fuzz target: optimizer states as a worker's kLoadStates command carries
// them to a server (Optimizer::load_states, src/optim/state_io.cpp). Bad
// bytes must throw pushpull::Error and change nothing; an optimizer that
// loaded them must still update its keys' weights without crashing.
#include "fuzz_input.h"
#include "pushpull/array.h"
#include "pushpull/error.h"
#include "pushpull/optimizer.h"

using namespace pushpull;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  static const char* kSpecs[] = {"sgd:learning_rate=0.1,momentum=0.9", "adam", "rmsprop",
                                 "adagrad"};
  auto opt = create_optimizer(OptimizerSpec::parse(kSpecs[sel % 4]));
  try {
    opt->load_states({reinterpret_cast<const char*>(in.data()), in.size()}, "<fuzz>");
  } catch (const pushpull::Error&) {
    return 0;
  }
  // Loaded: every key it holds must still update (weights of 4 elements).
  Array w = Array::full(Shape{4}, 1.0), g = Array::full(Shape{4}, 0.5);
  for (Key k : {Key(0), Key(1), Key(7)}) {
    try {
      opt->update(k, w.view(), g.view());
    } catch (const pushpull::Error&) {
    }
  }
  return 0;
}
