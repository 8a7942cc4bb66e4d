// SPDX-License-Identifier: Apache-2.0
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/optimizer.h"

namespace pushpull {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class StateIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pp_state_io_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const char* name) const { return (dir_ / name).string(); }

  // Drives `opt` through `steps` updates of two keys with seeded gradients.
  static void train(Optimizer& opt, std::vector<float>& a, std::vector<float>& b, int steps,
                    unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    std::vector<float> g(a.size());
    for (int s = 0; s < steps; ++s) {
      for (auto& x : g)
        x = nd(rng);
      opt.update(5, ArrayView(a.data(), {int64_t(a.size())}),
                 ArrayView(g.data(), {int64_t(g.size())}));
      opt.update(9, ArrayView(b.data(), {3, 2}), ArrayView(g.data(), {3, 2}));
    }
  }

  fs::path dir_;
};

TEST_F(StateIoTest, RoundTripIsBitExact) {
  const char* spec = "adam:learning_rate=0.01,wd=0.001";
  auto a = create_optimizer(OptimizerSpec::parse(spec));
  std::vector<float> wa(6, 0.5f), wb(6, -0.25f);
  train(*a, wa, wb, 5, 1);
  a->save_states_to_file(path("adam.states"));
  EXPECT_FALSE(fs::exists(path("adam.states.tmp")));

  auto b = create_optimizer(OptimizerSpec::parse(spec));
  b->load_states_from_file(path("adam.states"));
  EXPECT_EQ(b->save_states(), a->save_states());
  EXPECT_EQ(b->update_count(5), 5);
  EXPECT_EQ(b->update_count(9), 5);

  // Continuing from the loaded states gives the same bits as continuing the original.
  std::vector<float> wa2 = wa, wb2 = wb;
  train(*a, wa, wb, 3, 2);
  train(*b, wa2, wb2, 3, 2);
  EXPECT_EQ(std::memcmp(wa.data(), wa2.data(), wa.size() * 4), 0);
  EXPECT_EQ(std::memcmp(wb.data(), wb2.data(), wb.size() * 4), 0);
}

TEST_F(StateIoTest, StringKeysAndMasterCopiesRoundTrip) {
  auto a = create_optimizer(OptimizerSpec::parse("sgd:momentum=0.9,multi_precision=1"));
  uint16_t w[3] = {float_to_half(1.0f), float_to_half(2.0f), float_to_half(3.0f)};
  uint16_t g[3] = {float_to_half(0.1f), float_to_half(0.2f), float_to_half(0.3f)};
  a->update("fc1.weight", ArrayView(w, DType::kFloat16, {3}), ArrayView(g, DType::kFloat16, {3}));
  a->update("", ArrayView(w, DType::kFloat16, {3}), ArrayView(g, DType::kFloat16, {3}));
  std::string bytes = a->save_states();
  auto b = create_optimizer(OptimizerSpec::parse("sgd:momentum=0.9,multi_precision=1"));
  b->load_states(bytes);
  EXPECT_EQ(b->save_states(), bytes);
  EXPECT_EQ(b->update_count("fc1.weight"), 1);
  EXPECT_EQ(b->update_count(""), 1);
}

TEST_F(StateIoTest, EmptyStatesRoundTrip) {
  auto a = create_optimizer(OptimizerSpec::parse("sgd"));
  auto b = create_optimizer(OptimizerSpec::parse("sgd"));
  b->load_states(a->save_states());
  EXPECT_EQ(b->num_keys(), 0u);
}

TEST_F(StateIoTest, TruncatedFileIsAnIoErrorNamingTheFile) {
  auto a = create_optimizer(OptimizerSpec::parse("adagrad"));
  std::vector<float> wa(6, 1), wb(6, 2);
  train(*a, wa, wb, 2, 3);
  std::string bytes = a->save_states();
  auto b = create_optimizer(OptimizerSpec::parse("adagrad"));
  train(*b, wa, wb, 1, 4);
  const std::string before = b->save_states();
  for (size_t len :
       {size_t{0}, size_t{4}, size_t{11}, size_t{20}, bytes.size() / 2, bytes.size() - 1}) {
    std::string p = path("cut.states");
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), len);
    try {
      b->load_states_from_file(p);
      FAIL() << "loaded a file cut at " << len;
    } catch (const IoError& e) {
      EXPECT_THAT(e.what(), HasSubstr(p)) << len;
    }
    EXPECT_EQ(b->save_states(), before) << "a failed load changed the states";
  }
}

TEST_F(StateIoTest, CorruptBytesAreDetected) {
  auto a = create_optimizer(OptimizerSpec::parse("rmsprop"));
  std::vector<float> wa(6, 1), wb(6, 2);
  train(*a, wa, wb, 2, 5);
  std::string bytes = a->save_states();
  // Flip one bit of every 7th byte in turn (header, keys, array data, checksum).
  for (size_t i = 0; i < bytes.size(); i += 7) {
    std::string bad = bytes;
    bad[i] ^= 0x10;
    auto b = create_optimizer(OptimizerSpec::parse("rmsprop"));
    EXPECT_THROW(b->load_states(bad, "flip.states"), IoError) << "byte " << i;
  }
  std::string p = path("corrupt.states");
  std::string bad = bytes;
  bad[bad.size() / 2] ^= 1;
  std::ofstream(p, std::ios::binary).write(bad.data(), bad.size());
  auto b = create_optimizer(OptimizerSpec::parse("rmsprop"));
  try {
    b->load_states_from_file(p);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(p));
    EXPECT_THAT(e.what(), HasSubstr("corrupt"));
  }
  EXPECT_THROW(b->load_states("not a state file at all, long enough", "junk"), IoError);
}

TEST_F(StateIoTest, StatesOfAnotherOptimizerAreRefused) {
  auto a = create_optimizer(OptimizerSpec::parse("adam"));
  std::vector<float> wa(6, 1), wb(6, 2);
  train(*a, wa, wb, 1, 6);
  auto b = create_optimizer(OptimizerSpec::parse("sgd:momentum=0.9"));
  try {
    b->load_states(a->save_states(), "adam.states");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("adam"));
    EXPECT_THAT(e.what(), HasSubstr("sgd"));
  }
  // Same name, different configuration: the mismatch shows at the next update.
  auto c = create_optimizer(OptimizerSpec::parse("sgd:momentum=0.9"));
  auto d = create_optimizer(OptimizerSpec::parse("sgd"));
  train(*c, wa, wb, 1, 7);
  d->load_states(c->save_states());
  EXPECT_THROW(train(*d, wa, wb, 1, 8), InvalidArgument);
}

TEST_F(StateIoTest, MissingFileIsAnIoError) {
  auto a = create_optimizer(OptimizerSpec::parse("sgd"));
  try {
    a->load_states_from_file(path("nope.states"));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("nope.states"));
  }
  EXPECT_THROW(a->save_states_to_file(path("no/such/dir/x.states")), IoError);
}

}  // namespace
}  // namespace pushpull
