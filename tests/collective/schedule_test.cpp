// SPDX-License-Identifier: Apache-2.0
// The schedule executors (schedule.h) on their own, over every transport:
// the in-process and shared-memory transports run schedules with posted
// sends and receives (run_posted), TCP on its direct streams
// (run_on_streams). Hand-made schedules, so each rule is seen by itself:
// more scratch receives than any executor has slots (slots reused only once
// reduced), a send held until the receives it waits for are done, a
// reduction into memory this rank is still sending (Recv::after_sends)
// with messages larger than a socket's buffers, receives from several
// peers, and a mismatched message failing the operation instead of hanging.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "fabrics.h"
#include "transport/schedule.h"

namespace pushpull::collective {

using transport::op_tag;
using transport::Schedule;
using transport::Transport;

namespace {

using testing::Kind;

class Schedules : public ::testing::TestWithParam<Kind> {
 protected:
  testing::Fabrics fabrics_{GetParam()};
};

Schedule base_schedule(std::vector<char>* scratch, const char* what,
                       Millis timeout = Millis(10000)) {
  Schedule s;
  s.dtype = DType::kInt64;
  s.op = ReduceOp::kSum;
  s.scratch = scratch;
  s.timeout = timeout;
  s.what = what;
  return s;
}

// Rank 0 sends 40 messages of 8 KiB (values i * 1000 + j); rank 1 receives
// each into scratch and adds it into acc[i % 3]: 40 scratch receives, more
// than any executor's slots, so slots are reused while later messages are
// already on their way. Then rank 1 sends acc back in one message, which
// rank 0 receives in place.
TEST_P(Schedules, ScratchSlotsAreReusedOnlyOnceReduced) {
  constexpr size_t kCount = 1024, kMsgs = 40;
  fabrics_.run(2, [&](int r, Transport& t) {
    std::vector<char> scratch;
    Schedule s = base_schedule(&scratch, "slots test");
    s.message_bytes = kCount * 8;
    std::vector<std::vector<int64_t>> msgs(kMsgs, std::vector<int64_t>(kCount));
    std::vector<int64_t> acc(3 * kCount, 0), back(3 * kCount, -1);
    if (r == 0) {
      for (size_t i = 0; i < kMsgs; ++i) {
        for (size_t j = 0; j < kCount; ++j)
          msgs[i][j] = static_cast<int64_t>(i * 1000 + j);
        s.send(1, op_tag(1, static_cast<uint32_t>(i)), msgs[i].data(), kCount * 8);
      }
      s.recv(1, op_tag(1, 1000), back.data(), back.size() * 8);
    } else {
      for (size_t i = 0; i < kMsgs; ++i)
        s.recv(0, op_tag(1, static_cast<uint32_t>(i)), nullptr, kCount * 8,
               acc.data() + (i % 3) * kCount);
      s.send(0, op_tag(1, 1000), acc.data(), acc.size() * 8);  // after all 40
    }
    t.run(s);
    if (r == 0) {
      for (size_t k = 0; k < 3; ++k)
        for (size_t j : {size_t{0}, size_t{17}, kCount - 1}) {
          int64_t want = 0;
          for (size_t i = k; i < kMsgs; i += 3)
            want += static_cast<int64_t>(i * 1000 + j);
          EXPECT_EQ(back[k * kCount + j], want) << "block " << k << " element " << j;
        }
    } else {
      EXPECT_NE(scratch.size(), 0u);  // the executor grew the caller's scratch
    }
  });
}

// Two ranks swap 4 MiB vectors (more than loopback's socket buffers take at
// once) and each adds the other's into the very vector it is sending:
// after_sends holds the reduction until the send has left, so both get
// exactly a + b. Three rounds, as recursive doubling does.
TEST_P(Schedules, AReductionIntoWhatIsBeingSentWaitsForTheSend) {
  constexpr size_t kCount = 512 << 10;  // int64: 4 MiB
  fabrics_.run(2, [&](int r, Transport& t) {
    std::vector<char> scratch;
    Schedule s = base_schedule(&scratch, "after_sends test");
    s.message_bytes = kCount * 8;
    std::vector<int64_t> v(kCount);
    for (size_t j = 0; j < kCount; ++j)
      v[j] = static_cast<int64_t>(j) * (r + 1);
    for (uint32_t round = 0; round < 3; ++round) {
      s.send(1 - r, op_tag(2, round), v.data(), kCount * 8);
      s.recv(1 - r, op_tag(2, round), nullptr, kCount * 8, v.data(), true);
    }
    t.run(s);
    // Each round doubles the pair's sum: 3 j, then 6 j, then 12 j.
    for (size_t j : {size_t{0}, size_t{1}, size_t{4097}, kCount / 2, kCount - 1})
      ASSERT_EQ(v[j], static_cast<int64_t>(j) * 12) << "rank " << r << " element " << j;
  });
}

// Rank 0 receives from ranks 1 and 2 alternately (each message reduced
// into one total) and answers each peer only once both of its messages
// are in: receives from several peers, sends waiting on receives.
TEST_P(Schedules, SeveralPeersAndSendsThatWaitForReceives) {
  constexpr size_t kCount = 2048;
  fabrics_.run(3, [&](int r, Transport& t) {
    std::vector<char> scratch;
    Schedule s = base_schedule(&scratch, "peers test");
    s.message_bytes = kCount * 8;
    std::vector<int64_t> mine(kCount), total(kCount, 0), answer(kCount, -1);
    std::iota(mine.begin(), mine.end(), int64_t{r} * 100000);
    if (r == 0) {
      for (uint32_t k = 0; k < 2; ++k)
        for (int p : {1, 2})
          s.recv(p, op_tag(3, k), nullptr, kCount * 8, total.data());
      for (int p : {1, 2})
        s.send(p, op_tag(3, 9), total.data(), kCount * 8);
    } else {
      for (uint32_t k = 0; k < 2; ++k)
        s.send(0, op_tag(3, k), mine.data(), kCount * 8);
      s.recv(0, op_tag(3, 9), answer.data(), kCount * 8);
    }
    t.run(s);
    std::vector<int64_t>& got = r == 0 ? total : answer;
    for (size_t j : {size_t{0}, size_t{999}, kCount - 1})
      EXPECT_EQ(got[j],
                2 * (100000 + static_cast<int64_t>(j)) + 2 * (200000 + static_cast<int64_t>(j)))
          << "rank " << r;
  });
}

// Rank 1 expects 16 bytes where rank 0 sends 8: the operation fails on the
// receiving rank (a ProtocolError from the posted receive or the stream's
// header check; never a hang) and the sender is not left waiting forever.
TEST_P(Schedules, AMismatchedMessageFailsTheOperation) {
  std::vector<std::string> errors(2);
  fabrics_.run(2, [&](int r, Transport& t) {
    int64_t out[1] = {7}, in[2] = {0, 0};
    Schedule s = base_schedule(nullptr, "mismatch test", Millis(1500));
    s.message_bytes = 16;
    if (r == 0)
      s.send(1, op_tag(4, 0), out, sizeof out);
    else
      s.recv(0, op_tag(4, 0), in, sizeof in);
    try {
      t.run(s);
    } catch (const Error& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
    if (r == 1) t.close(Status(ErrorCode::kProtocolError, "test: mismatch seen"));
  });
  EXPECT_FALSE(errors[1].empty()) << "the receiver accepted a message of the wrong size";
}

INSTANTIATE_TEST_SUITE_P(EveryTransport, Schedules,
                         ::testing::Values(Kind::kInProcess, Kind::kTcp, Kind::kShm),
                         [](const auto& info) { return testing::kind_name(info.param); });

}  // namespace
}  // namespace pushpull::collective
