// SPDX-License-Identifier: Apache-2.0
// Worker restart on the server side (docs/ps.md "Worker restart"), driven
// directly on a ServerStore: a replacement's rejoin gets its rank's applied
// and accepted push numbers and the current value; its re-sent push of a
// round the old process had already pushed (accepted, not applied) takes
// that push's place and counts once; one already applied is acknowledged and
// not counted; the old process's requests are never answered. Also the
// codecs (rejoin head, the address book's restart fields).
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>

#include "cluster/protocol.h"
#include "ps/protocol.h"
#include "ps/server_store.h"

namespace pushpull::ps {
namespace {

using namespace std::chrono_literals;

class Recorder : public ServerResponder {
 public:
  void reply(const RequestMeta& to, const Status& s, DType, std::span<const std::byte> data,
             std::shared_ptr<void>) override {
    std::lock_guard lock(mu_);
    replies_[to.request_id] = {s, {data.begin(), data.end()}};
    cv_.notify_all();
  }
  bool wait_reply(uint64_t id, std::chrono::milliseconds t = 5s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, t, [&] { return replies_.count(id) > 0; });
  }
  bool has(uint64_t id) {
    std::lock_guard lock(mu_);
    return replies_.count(id) > 0;
  }
  std::pair<Status, std::vector<std::byte>> get(uint64_t id) {
    std::lock_guard lock(mu_);
    return replies_.at(id);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::pair<Status, std::vector<std::byte>>> replies_;
};

Payload floats(std::vector<float> v) {
  auto a = std::make_shared<Array>(Shape{static_cast<int64_t>(v.size())}, DType::kFloat32);
  std::memcpy(a->data(), v.data(), v.size() * 4);
  return Payload{a->view(), a};
}

std::vector<float> as_floats(const std::vector<std::byte>& b, size_t skip = 0) {
  std::vector<float> f((b.size() - skip) / 4);
  std::memcpy(f.data(), b.data() + skip, f.size() * 4);
  return f;
}

const PartId kPart{7, 0};
constexpr uint64_t kNew = uint64_t{1} << 40;  // the replacement's request ids

// 2 workers, sync, no optimizer (the round's sum becomes the value): round 1
// done by both, then worker 1 pushed round 2 and died.
struct Store {
  Store() : store({2, true, 2, 0}, r) {
    store.init({0, 1}, kPart, "w", floats({0, 0}));
    EXPECT_TRUE(r.wait_reply(1));
    store.push({0, 2}, kPart, floats({1, 1}), false, 1);
    store.push({1, 3}, kPart, floats({2, 2}), false, 1);
    EXPECT_TRUE(r.wait_reply(3));
    store.push({1, 4}, kPart, floats({10, 10}), false, 2);  // the old process's last push
    store.pull({1, 5}, kPart, {});                          // and a pull waiting for it
  }
  Recorder r;
  ServerStore store;
};

TEST(WorkerRestart, RejoinTellsTheRanksPushNumbersAndTheValue) {
  Store s;
  s.store.rejoin({1, kNew + 1}, kPart);
  ASSERT_TRUE(s.r.wait_reply(kNew + 1));
  auto [status, bytes] = s.r.get(kNew + 1);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  uint64_t applied = 0, accepted = 0;
  ASSERT_TRUE(decode_rejoin(bytes, &applied, &accepted).is_ok());
  EXPECT_EQ(applied, 1u);
  EXPECT_EQ(accepted, 2u);
  EXPECT_EQ(as_floats(bytes, kRejoinHeadBytes), (std::vector<float>{3, 3}));
}

TEST(WorkerRestart, TheReplacementsPushOfAPendingRoundIsAdoptedAndCountsOnce) {
  Store s;
  s.store.rejoin({1, kNew + 1}, kPart);
  ASSERT_TRUE(s.r.wait_reply(kNew + 1));
  // The replacement pushes round 2 again: it takes the old push's place.
  s.store.push({1, kNew + 2}, kPart, floats({10, 10}), false, 2);
  EXPECT_FALSE(s.r.wait_reply(kNew + 2, 100ms)) << "round 2 applied without worker 0";
  s.store.push({0, 6}, kPart, floats({1, 1}), false, 2);
  ASSERT_TRUE(s.r.wait_reply(kNew + 2));
  EXPECT_TRUE(s.r.get(kNew + 2).first.is_ok());
  s.store.pull({1, kNew + 3}, kPart, {});
  ASSERT_TRUE(s.r.wait_reply(kNew + 3));
  EXPECT_EQ(as_floats(s.r.get(kNew + 3).second), (std::vector<float>{11, 11}));
  // The old process's push and pull are never answered (ids it alone knew).
  s.store.wait_idle(5s);
  EXPECT_FALSE(s.r.has(4));
  EXPECT_FALSE(s.r.has(5));
  // Round 3 works as any other.
  s.store.push({0, 7}, kPart, floats({1, 1}), false, 3);
  s.store.push({1, kNew + 4}, kPart, floats({2, 2}), false, 3);
  s.store.pull({0, 8}, kPart, {});
  ASSERT_TRUE(s.r.wait_reply(8));
  EXPECT_EQ(as_floats(s.r.get(8).second), (std::vector<float>{3, 3}));
}

TEST(WorkerRestart, TheReplacementsPushOfAnAppliedRoundIsNotCountedAgain) {
  Store s;
  s.store.push({0, 6}, kPart, floats({1, 1}), false, 2);  // round 2 completes: 11
  ASSERT_TRUE(s.r.wait_reply(6));
  s.store.rejoin({1, kNew + 1}, kPart);
  ASSERT_TRUE(s.r.wait_reply(kNew + 1));
  uint64_t applied = 0, accepted = 0;
  ASSERT_TRUE(decode_rejoin(s.r.get(kNew + 1).second, &applied, &accepted).is_ok());
  EXPECT_EQ(applied, 2u);
  s.store.push({1, kNew + 2}, kPart, floats({10, 10}), false, 2);
  ASSERT_TRUE(s.r.wait_reply(kNew + 2));
  EXPECT_TRUE(s.r.get(kNew + 2).first.is_ok());
  s.store.pull({1, kNew + 3}, kPart, {});
  ASSERT_TRUE(s.r.wait_reply(kNew + 3));
  EXPECT_EQ(as_floats(s.r.get(kNew + 3).second), (std::vector<float>{11, 11}));
}

TEST(WorkerRestart, WithoutRejoinAPushNumberSentTwiceIsStillRefused) {
  Store s;
  s.store.push({1, 9}, kPart, floats({10, 10}), false, 2);
  ASSERT_TRUE(s.r.wait_reply(9));
  EXPECT_EQ(s.r.get(9).first.code(), ErrorCode::kProtocolError);
}

TEST(WorkerRestart, RejoinOfAnUnknownKeyOrWorkerIsRefused) {
  Store s;
  s.store.rejoin({1, kNew + 1}, PartId{8, 0});
  s.store.rejoin({5, kNew + 2}, kPart);
  ASSERT_TRUE(s.r.wait_reply(kNew + 1));
  ASSERT_TRUE(s.r.wait_reply(kNew + 2));
  EXPECT_EQ(s.r.get(kNew + 1).first.code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.r.get(kNew + 2).first.code(), ErrorCode::kInvalidArgument);
}

TEST(WorkerRestart, RejoinHeadDecoderIsBoundsChecked) {
  auto head = encode_rejoin(3, 4);
  ASSERT_EQ(head.size(), kRejoinHeadBytes);
  uint64_t a = 0, b = 0;
  EXPECT_TRUE(decode_rejoin(head, &a, &b).is_ok());
  EXPECT_EQ(a, 3u);
  EXPECT_EQ(b, 4u);
  for (size_t n = 0; n < head.size(); ++n)
    EXPECT_FALSE(decode_rejoin(std::span(head).first(n), &a, &b).is_ok()) << n;
  auto bad = encode_rejoin(5, 4);  // applied beyond accepted: impossible
  EXPECT_FALSE(decode_rejoin(bad, &a, &b).is_ok());
}

TEST(WorkerRestart, AddressBookCarriesTheRestartFields) {
  cluster::AddressBook book;
  book.scheduler = {Role::kScheduler, 0, "h", 1};
  book.servers = {{Role::kServer, 0, "h", 2}};
  book.workers = {{Role::kWorker, 0, "h", 3}, {Role::kWorker, 1, "h", 4}};
  book.worker_restarts = true;
  book.incarnation = 2;
  auto bytes = cluster::encode_book(1, book);
  int32_t rank = -1;
  cluster::AddressBook back;
  ASSERT_TRUE(cluster::decode_book(bytes, &rank, &back).is_ok());
  EXPECT_EQ(rank, 1);
  EXPECT_TRUE(back.worker_restarts);
  EXPECT_EQ(back.incarnation, 2);
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(cluster::decode_book(std::span(bytes).first(n), &rank, &back).is_ok()) << n;
  EXPECT_FALSE(back.one_host);
  bytes[bytes.size() - 5] = std::byte{7};  // an unknown flag
  EXPECT_FALSE(cluster::decode_book(bytes, &rank, &back).is_ok());
  book.one_host = true;
  bytes = cluster::encode_book(1, book);
  ASSERT_TRUE(cluster::decode_book(bytes, &rank, &back).is_ok());
  EXPECT_TRUE(back.one_host);
  EXPECT_TRUE(back.worker_restarts);
}

// One host means every server and worker registered the same known host;
// the scheduler's host does not count (it carries no tensors).
TEST(WorkerRestart, OneHostIsEveryServerAndWorkerOnTheSameHost) {
  cluster::AddressBook book;
  book.scheduler = {Role::kScheduler, 0, "10.0.0.9", 1};
  book.servers = {{Role::kServer, 0, "10.0.0.1", 2}, {Role::kServer, 1, "10.0.0.1", 3}};
  book.workers = {{Role::kWorker, 0, "10.0.0.1", 4}};
  EXPECT_TRUE(cluster::same_host(book));
  book.workers.push_back({Role::kWorker, 1, "10.0.0.2", 5});
  EXPECT_FALSE(cluster::same_host(book));
  book.workers.back().host = "";
  EXPECT_FALSE(cluster::same_host(book)) << "an unknown host is not this one";
  EXPECT_FALSE(cluster::same_host(cluster::AddressBook{}));
}

}  // namespace
}  // namespace pushpull::ps
