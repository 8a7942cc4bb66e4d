// SPDX-License-Identifier: Apache-2.0
// The group's Store (collective/store.h): its wire forms; the key protocol
// over an in-memory store (what torch's c10d store gives the backend), ranks
// as threads; and the MASTER_ADDR store (tcp_store.h) over real TCP on
// loopback: write-once keys, a member that dies mid-meeting, rank 0 gone.
#include "collective/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "collective/tcp_store.h"
#include "pushpull/collective.h"
#include "support/media.h"
#include "support/ports.h"
#include "tcp_group.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::collective {

using transport::Clock;

namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Bytes = std::vector<std::byte>;

// A Store in memory, shared by threads (the c10d store's stand-in).
class MemoryStore final : public Store {
 public:
  void set(const std::string& key, Bytes value) override {
    std::lock_guard lock(mu_);
    kv_[key] = std::move(value);  // as c10d: the last write wins
    cv_.notify_all();
  }
  Bytes get(const std::string& key, Clock::time_point deadline) override {
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return kv_.count(key) > 0; }))
      throw Timeout("no " + key);
    return kv_[key];
  }
  std::vector<std::string> wait(const std::vector<std::string>& keys,
                                Clock::time_point deadline) override {
    std::unique_lock lock(mu_);
    auto missing = [&] {
      std::vector<std::string> out;
      for (const auto& k : keys)
        if (!kv_.count(k)) out.push_back(k);
      return out;
    };
    cv_.wait_until(lock, deadline, [&] { return missing().empty(); });
    return missing();
  }
  std::string where() const override { return "memory"; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> kv_;
};

// Runs fn(rank) for ranks 0..n-1 on threads; each thread's error message
// ("" when it returned), its type checked by `is_type`.
std::vector<std::string> on_threads(int n, const std::function<void(int)>& fn,
                                    std::vector<ErrorCode>* codes = nullptr) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  if (codes) codes->assign(static_cast<size_t>(n), ErrorCode::kOk);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
        if (codes) (*codes)[static_cast<size_t>(r)] = e.code();
      }
    });
  for (auto& t : threads)
    t.join();
  return errors;
}

TEST(StoreWire, EntriesVerdictsAndRequestsRoundTripAndRejectGarbage) {
  int size = 0, port = 0;
  std::string host;
  Bytes entry = encode_entry(4, "10.0.0.2", 9100);
  ASSERT_TRUE(decode_entry(entry, &size, &host, &port).is_ok());
  EXPECT_EQ(size, 4);
  EXPECT_EQ(host, "10.0.0.2");
  EXPECT_EQ(port, 9100);
  EXPECT_FALSE(decode_entry(std::span(entry).first(entry.size() - 1), &size, &host, &port));
  EXPECT_FALSE(decode_entry(encode_entry(4, "h", 0), &size, &host, &port)) << "port 0";

  AddressList book{{"10.0.0.1", 9000}, {"host-b", 9001}}, back;
  Status verdict;
  Bytes ok = encode_verdict({}, book);
  ASSERT_TRUE(decode_verdict(ok, &verdict, &back).is_ok());
  EXPECT_TRUE(verdict.is_ok());
  EXPECT_EQ(back, book);
  Bytes refused = encode_verdict(Status(ErrorCode::kInvalidArgument, "why"), {});
  ASSERT_TRUE(decode_verdict(refused, &verdict, &back).is_ok());
  EXPECT_EQ(verdict.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(verdict.message(), "why");
  EXPECT_FALSE(decode_verdict(std::span(ok).first(ok.size() - 1), &verdict, &back));
  Bytes bad_code = refused;
  bad_code[0] = std::byte{99};
  EXPECT_FALSE(decode_verdict(bad_code, &verdict, &back));

  std::string key;
  Bytes value;
  Bytes set = encode_store_request("rank/3", entry);
  ASSERT_TRUE(decode_store_request(set, true, &key, &value).is_ok());
  EXPECT_EQ(key, "rank/3");
  EXPECT_EQ(value, entry);
  EXPECT_FALSE(decode_store_request(set, false, &key, &value)) << "a get has no value";
  EXPECT_FALSE(decode_store_request(encode_store_request("", {}), false, &key, &value));
  EXPECT_FALSE(
      decode_store_request(encode_store_request(std::string(300, 'k'), {}), false, &key, &value));
  Bytes junk(3, std::byte{0xff});
  EXPECT_FALSE(decode_store_request(junk, true, &key, &value));
}

TEST(ExchangeBook, EveryRankLeavesWithTheSameBook) {
  MemoryStore store;
  std::vector<AddressList> books(4);
  auto errors = on_threads(4, [&](int r) {
    books[static_cast<size_t>(r)] =
        exchange_book(store, r, 4, "h" + std::to_string(r / 2), 5000 + r, Clock::now() + 10s);
  });
  const AddressList want{{"h0", 5000}, {"h0", 5001}, {"h1", 5002}, {"h1", 5003}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "");
    EXPECT_EQ(books[static_cast<size_t>(r)], want);
  }
}

TEST(ExchangeBook, AMissingRankTimesOutNamingItOnEveryRank) {
  MemoryStore store;
  std::vector<ErrorCode> codes;
  const auto start = Clock::now();
  auto errors = on_threads(
      2, [&](int r) { exchange_book(store, r, 3, "h", 5000 + r, Clock::now() + 500ms); }, &codes);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(codes[static_cast<size_t>(r)], ErrorCode::kTimeout) << errors[static_cast<size_t>(r)];
    EXPECT_THAT(errors[static_cast<size_t>(r)], HasSubstr("for ranks 2"));
  }
  EXPECT_THAT(errors[1], HasSubstr("rank 0 ended the rendezvous"));
  EXPECT_LT(Clock::now() - start, 2s) << "rank 1 told at once, not at its own deadline + 2 s";
}

TEST(ExchangeBook, AnotherWorldSizeIsRefusedOnEveryRankWithTheReason) {
  MemoryStore store;
  std::vector<ErrorCode> codes;
  auto errors = on_threads(
      3, [&](int r) { exchange_book(store, r, r == 2 ? 4 : 3, "h", 5000 + r, Clock::now() + 10s); },
      &codes);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(codes[static_cast<size_t>(r)], ErrorCode::kInvalidArgument)
        << errors[static_cast<size_t>(r)];
    EXPECT_THAT(errors[static_cast<size_t>(r)], HasSubstr("rank 2 says the world has 4 ranks"));
  }
}

// The torch backend's path: a Session whose ranks meet through a Store.
TEST(SessionOverAStore, MeetsThroughTheStoreAndAllreduces) {
  MemoryStore store;
  auto errors = on_threads(3, [&](int r) {
    Options o;
    o.collective.rank = r;
    o.collective.size = 3;
    o.collective.master_addr = "127.0.0.1";  // no port: nobody listens there
    o.net.job_id = "store-session-test";
    o.cluster.startup_timeout = 20s;
    Session s(o, store);
    EXPECT_EQ(s.mode(), "rendezvous");
    EXPECT_EQ(s.local_size(), 3);
    Array a = Array::full(Shape{100}, r + 1.0);
    s.communicator().allreduce("x", a.view());
    EXPECT_EQ(a.as<float>()[99], 6.0f);
  });
  for (auto& e : errors)
    EXPECT_EQ(e, "");
}

Options tcp_options(int rank, int size, int port, const std::string& host = "127.0.0.1") {
  return testing::master_addr_options("store-test", rank, size, port, host);
}

// The MASTER_ADDR store's tests run over each medium (support/media.h).
class TcpStoreOn : public test::Medium {};
INSTANTIATE_TEST_SUITE_P(Media, TcpStoreOn, ::testing::ValuesIn(test::kMedia), test::medium_name);

// Sessions meet through the MASTER_ADDR store rank 0 hosts and their mesh
// allreduces: on the in-process medium every connection (the store's, the
// mesh's and its streams) is a socketpair.
TEST_P(TcpStoreOn, SessionsMeetThroughItAndAllreduce) {
  const int port = test::free_port();
  auto errors = on_threads(3, [&](int r) {
    Options o = tcp_options(r, 3, port, host());
    o.cluster.startup_timeout = 20s;
    Session s(o);
    EXPECT_EQ(s.mode(), "rendezvous");
    Array a = Array::full(Shape{1000}, r + 1.0);
    s.communicator().allreduce("x", a.view());
    EXPECT_EQ(a.as<float>()[999], 6.0f);
  });
  for (auto& e : errors)
    EXPECT_EQ(e, "");
}

TEST_P(TcpStoreOn, KeysAreWriteOnceAndGetsTimeOutNamingTheKey) {
  const int port = test::free_port();
  const auto deadline = Clock::now() + 10s;
  TcpStore root(tcp_options(0, 2, port, host()), deadline);
  {
    TcpStore member(tcp_options(1, 2, port, host()), deadline);
    const Bytes a{std::byte{1}}, b{std::byte{2}};
    member.set("x/1", a);
    member.set("x/1", a);  // the same bytes again: fine
    try {
      member.set("x/1", b);
      ADD_FAILURE() << "a second value was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("two processes claim one rank"));
    }
    EXPECT_EQ(root.get("x/1", deadline), a);
    root.set("from-0", b);
    EXPECT_EQ(member.get("from-0", deadline), b);
    EXPECT_THROW(root.set("from-0", a), InvalidArgument);
    try {
      member.get("never", Clock::now() + 200ms);
      ADD_FAILURE() << "no timeout";
    } catch (const Timeout& e) {
      EXPECT_THAT(e.what(), HasSubstr("'never'"));
    }
    EXPECT_EQ(root.wait({"x/1", "never"}, Clock::now() + 100ms), std::vector<std::string>{"never"});
  }
}

// Rank 1 arrives, then dies while rank 0 still waits for rank 3: rank 0
// fails naming it, and tells rank 2, which waits for the book.
TEST_P(TcpStoreOn, ARankThatDiesDuringTheRendezvousIsAPeerFailureOnEveryRank) {
  const int port = test::free_port();
  const auto deadline = Clock::now() + 10s;
  auto root = std::async(std::launch::async, [&] {
    TcpStore store(tcp_options(0, 4, port, host()), deadline);
    return exchange_book(store, 0, 4, "127.0.0.1", 1000, deadline);
  });
  auto two = std::make_unique<TcpStore>(tcp_options(2, 4, port, host()), deadline);
  two->set("rank/2", encode_entry(4, "127.0.0.1", 1002));
  auto book = std::async(std::launch::async, [&] { return two->get("book", deadline); });
  {
    // Rank 1 sets its entry and waits for the book, then its process "dies"
    // (the connection closes).
    transport::TransportConfig c;
    c.net = tcp_options(1, 4, port, host()).net;
    c.role = Role::kWorker;
    c.rank = 1;
    transport::MessageTransport t(c);
    std::promise<void> set_done;
    t.set_handler(kStoreReply, kStoreReply, [&](transport::Message&& m) {
      if (m.header.request_id == 1) set_done.set_value();
    });
    t.start();
    transport::ConnId conn = t.connect(host(), port, 5s);
    auto set = encode_store_request("rank/1", encode_entry(4, "127.0.0.1", 1001));
    ASSERT_TRUE(t.send_copy(conn, transport::Header{.type = kStoreSet, .request_id = 1}, set.data(),
                            set.size())
                    .is_ok());
    auto get = encode_store_request("book", {});
    ASSERT_TRUE(t.send_copy(conn, transport::Header{.type = kStoreGet, .request_id = 2}, get.data(),
                            get.size())
                    .is_ok());
    ASSERT_EQ(set_done.get_future().wait_for(5s), std::future_status::ready);
  }
  Status verdict;
  AddressList ignored;
  ASSERT_TRUE(decode_verdict(book.get(), &verdict, &ignored).is_ok());
  EXPECT_EQ(verdict.code(), ErrorCode::kPeerFailure);
  EXPECT_THAT(verdict.message(), HasSubstr("rank 1"));
  two.reset();  // rank 0 lingers until its members left
  try {
    root.get();
    ADD_FAILURE() << "rank 0 did not notice";
  } catch (const PeerFailure& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1"));
    EXPECT_THAT(e.what(), HasSubstr("did it die?"));
  }
}

// Sessions over the MASTER_ADDR store: a rank with another WORLD_SIZE fails
// every rank with rank 0's reason, at once.
TEST_P(TcpStoreOn, AnotherWorldSizeFailsEverySessionWithTheReason) {
  const int port = test::free_port();
  std::vector<ErrorCode> codes;
  auto errors = on_threads(
      3,
      [&](int r) {
        Options o = tcp_options(r, r == 2 ? 4 : 3, port, host());
        o.cluster.startup_timeout = 20s;
        Session s(o);
      },
      &codes);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(codes[static_cast<size_t>(r)], ErrorCode::kInvalidArgument)
        << errors[static_cast<size_t>(r)];
    EXPECT_THAT(errors[static_cast<size_t>(r)], HasSubstr("rank 2 says the world has 4 ranks"));
  }
}

TEST_P(TcpStoreOn, RankZeroGoneIsAPeerFailure) {
  const int port = test::free_port();
  // Rank 0 that accepts, then closes every connection at its first request.
  transport::TransportConfig c;
  c.net = tcp_options(0, 2, port, host()).net;
  c.role = Role::kWorker;
  c.rank = 0;
  transport::MessageTransport zero(c);
  zero.listen(host(), port);
  zero.set_handler(kStoreSet, kStoreGet, [&](transport::Message&& m) {
    zero.close(m.conn, Status(ErrorCode::kPeerFailure, "gone"));
  });
  zero.start();
  TcpStore member(tcp_options(1, 2, port, host()), Clock::now() + 10s);
  try {
    member.get("book", Clock::now() + 10s);
    ADD_FAILURE() << "no failure";
  } catch (const PeerFailure& e) {
    EXPECT_THAT(e.what(), HasSubstr("did rank 0 fail?"));
  }
}

}  // namespace
}  // namespace pushpull::collective
