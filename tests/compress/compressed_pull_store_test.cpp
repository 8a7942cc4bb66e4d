// SPDX-License-Identifier: Apache-2.0
// Compressed pulls at the parameter server's store (ps/server_store.h,
// docs/kvstore.md "Compressed pulls"): a round of compressed pushes without
// an optimizer is answered compressed, encoded once with the server's own
// residual; every pull of the round gets the same bytes; the stored value,
// row pulls and the replica sent to backups are what those bytes decode to,
// so a promoted backup answers (uncompressed) the same numbers.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "compress/compressor.h"
#include "ps/server_store.h"

namespace pushpull::ps {
namespace {

using namespace std::chrono_literals;

class Recorder : public ServerResponder {
 public:
  explicit Recorder(bool hold_states = false) : replicate_(hold_states) {}
  void reply(const RequestMeta& to, const Status& s, DType, std::span<const std::byte> data,
             std::shared_ptr<void>) override {
    std::lock_guard lock(mu_);
    replies_[to.request_id] = {s, {data.begin(), data.end()}};
    cv_.notify_all();
  }
  bool replicate(const PartId&, std::shared_ptr<const ReplicaState> state,
                 std::function<void()> done) override {
    if (!replicate_) return false;
    {
      std::lock_guard lock(mu_);
      states_.push_back(*state);
    }
    done();  // the backup has it (no store call back in here: done queues)
    return true;
  }
  std::vector<std::byte> wait(uint64_t id) {
    std::unique_lock lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, 5s, [&] { return replies_.count(id) > 0; })) << id;
    auto& r = replies_[id];
    EXPECT_TRUE(r.first.is_ok()) << r.first.to_string();
    return r.second;
  }
  ReplicaState last_state() {
    std::lock_guard lock(mu_);
    return states_.back();
  }

 private:
  bool replicate_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::pair<Status, std::vector<std::byte>>> replies_;
  std::vector<ReplicaState> states_;
};

Payload bytes_payload(std::vector<std::byte> b, DType dtype, int64_t n) {
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(b));
  return Payload{ArrayView(owner->data(), dtype, Shape{n}), owner};
}

std::vector<float> as_floats(const std::vector<std::byte>& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}

constexpr size_t kN = 4099;  // not a whole number of words or blocks
const PartId kPart{3, 0};

// Each of 2 workers pushes 2bit-compressed gradients of 0.3 * (w + 1) per
// element (alternating signs); the server's value after each round follows
// the scalar model: S = sum of what the workers sent, x = R + S, q = Q(x),
// R = x - q.
TEST(CompressedPullStore, ARoundIsEncodedOnceWithTheServersResidual) {
  Recorder r(true);
  ServerStoreConfig config{2, true, 2, 0};
  config.replicate = true;
  ServerStore store(config, r);
  std::vector<std::byte> init(kN * 4, std::byte{0});
  store.init({0, 1, kPart.key}, kPart, "k", bytes_payload(init, DType::kFloat32, kN));
  r.wait(1);
  compress::Compressor worker[2] = {
      compress::Compressor(compress::parse_settings({{"type", "2bit"}})),
      compress::Compressor(compress::parse_settings({{"type", "2bit"}}))};
  const float t = 0.5f;
  float wres[2][2] = {{0, 0}, {0, 0}}, sres[2] = {0, 0};
  auto q2 = [&](float& res, float g) {
    res += g;
    const float q = res >= t ? t : (res <= -t ? -t : 0.0f);
    res -= q;
    return q;
  };
  uint64_t id = 10;
  for (int round = 0; round < 4; ++round) {
    float want[2];
    for (int cls = 0; cls < 2; ++cls) {
      float sum = 0;
      for (int w = 0; w < 2; ++w)
        sum += q2(wres[w][cls], (cls ? -0.3f : 0.3f) * static_cast<float>(w + 1));
      want[cls] = q2(sres[cls], sum);
    }
    for (int w = 0; w < 2; ++w) {
      std::vector<float> g(kN);
      for (size_t i = 0; i < kN; ++i)
        g[i] = (i % 2 ? -0.3f : 0.3f) * static_cast<float>(w + 1);
      std::vector<std::byte> wire(worker[w].encoded_bytes(kN));
      worker[w].encode(kPart.key, 0, kN, 0, g.data(), kN, wire.data());
      store.push({w, id++, kPart.key}, kPart,
                 bytes_payload(wire, DType::kUInt8, static_cast<int64_t>(wire.size())), true);
    }
    r.wait(id - 1);
    // Both workers pull: the same encoded bytes, 16x smaller than the value.
    const uint64_t p0 = id++, p1 = id++;
    store.pull({0, p0, kPart.key}, kPart, {});
    store.pull({1, p1, kPart.key}, kPart, {});
    const auto b0 = r.wait(p0), b1 = r.wait(p1);
    ASSERT_EQ(b0.size(), compress::kHeaderBytes + (kN + 15) / 16 * 4) << "round " << round;
    ASSERT_EQ(b0, b1) << "every worker gets the same bytes";
    std::vector<float> got(kN, 0.0f);
    ASSERT_TRUE(compress::decode_add(b0, got.data(), kN).is_ok());
    for (size_t i = 0; i < kN; ++i)
      ASSERT_EQ(got[i], want[i % 2]) << "round " << round << " i " << i;
    // Rows and the replica hold the decoded value (what a promoted backup
    // or a row_sparse_pull answers).
    const uint64_t rows = id++;
    store.pull({0, rows, kPart.key}, kPart, {Range{kN - 3, 3}});
    const auto tail = as_floats(r.wait(rows));
    ASSERT_EQ(tail.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(tail[i], want[(kN - 3 + i) % 2]);
    const ReplicaState state = r.last_state();
    ASSERT_EQ(state.value.view.numel(), static_cast<int64_t>(kN));
    EXPECT_EQ(std::memcmp(state.value.view.data, got.data(), kN * 4), 0) << "round " << round;
  }
}

// A backup that installs the primary's replica and is promoted answers the
// same numbers, uncompressed (the residual is not replicated: it starts at
// zero with the backup's first own round).
TEST(CompressedPullStore, APromotedBackupAnswersTheSameValue) {
  Recorder primary_r(true), backup_r;
  ServerStoreConfig config{1, true, 1, 0};
  config.replicate = true;
  ServerStore primary(config, primary_r);
  ServerStore backup(ServerStoreConfig{1, true, 1, 0}, backup_r);
  std::vector<std::byte> init(kN * 4, std::byte{0});
  primary.init({0, 1, kPart.key}, kPart, "k", bytes_payload(init, DType::kFloat32, kN));
  primary_r.wait(1);
  compress::Compressor c(compress::parse_settings({{"type", "1bit"}}));
  std::vector<float> g(kN);
  for (size_t i = 0; i < kN; ++i)
    g[i] = static_cast<float>(i % 5) - 2.0f;
  std::vector<std::byte> wire(c.encoded_bytes(kN));
  c.encode(kPart.key, 0, kN, 0, g.data(), kN, wire.data());
  primary.push({0, 2, kPart.key}, kPart,
               bytes_payload(wire, DType::kUInt8, static_cast<int64_t>(wire.size())), true, 1);
  primary_r.wait(2);
  primary.pull({0, 3, kPart.key}, kPart, {});
  const auto encoded = primary_r.wait(3);
  ASSERT_LT(encoded.size(), kN * 4) << "answered compressed";
  std::vector<float> want(kN, 0.0f);
  ASSERT_TRUE(compress::decode_add(encoded, want.data(), kN).is_ok());
  std::mutex mu;
  std::condition_variable cv;
  bool installed = false;
  backup.install_replica(kPart, primary_r.last_state(), [&](const Status& st) {
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    std::lock_guard lock(mu);
    installed = true;
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 5s, [&] { return installed; }));
  }
  backup.pull({0, 4, kPart.key}, kPart, {});
  const auto got = as_floats(backup_r.wait(4));
  ASSERT_EQ(got.size(), kN) << "a backup answers the value itself";
  EXPECT_EQ(std::memcmp(got.data(), want.data(), kN * 4), 0);
}

// With an optimizer the value is a weight, not a sum: pulls answer it whole.
TEST(CompressedPullStore, WithAnOptimizerPullsAnswerTheValueItself) {
  Recorder r;
  ServerStore store(ServerStoreConfig{1, true, 1, 0}, r);
  std::vector<std::byte> init(kN * 4, std::byte{0});
  store.init({0, 1, kPart.key}, kPart, "k", bytes_payload(init, DType::kFloat32, kN));
  r.wait(1);
  store.set_optimizer({0, 2, 0}, OptimizerSpec::parse("test:rescale_grad=1"));
  r.wait(2);
  compress::Compressor c(compress::parse_settings({{"type", "fp16"}}));
  std::vector<float> g(kN, 0.25f);
  std::vector<std::byte> wire(c.encoded_bytes(kN));
  c.encode(kPart.key, 0, kN, 0, g.data(), kN, wire.data());
  store.push({0, 3, kPart.key}, kPart,
             bytes_payload(wire, DType::kUInt8, static_cast<int64_t>(wire.size())), true);
  r.wait(3);
  store.pull({0, 4, kPart.key}, kPart, {});
  const auto got = as_floats(r.wait(4));
  ASSERT_EQ(got.size(), kN);
  EXPECT_EQ(got[0], 0.25f);
  EXPECT_EQ(got[kN - 1], 0.25f);
}

}  // namespace
}  // namespace pushpull::ps
