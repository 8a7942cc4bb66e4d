// SPDX-License-Identifier: Apache-2.0
// The same-host shared-memory path of the MessageTransport
// (transport/shm/shm_setup.h) against hand-driven peers: an honest one is
// served, a peer that dies or stops mid-payload closes only its connection,
// peers that lie in the setup or the frames are refused, and the offer is
// judged by the one host proof.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <future>

#include "shm_fixture.h"
#include "support/wait.h"
#include "transport/host_identity.h"
#include "transport/shm/shm_segment.h"
#include "transport/shm/shm_setup.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::transport {
namespace {

using namespace std::chrono_literals;
using test::pattern;
using test::RawClient;
using test::shm_config;
using test::Sink;
using test::TempShmDir;
using test::wait_until;

using test::kData;

// A hand-driven connector that sets the shared memory up itself.
struct RawShmPeer {
  explicit RawShmPeer(int port, int rank = 7) : raw(port) { raw.hello("", Role::kWorker, rank); }
  // Offers `record`; returns the acceptor's answer.
  ShmAnswer offer(const HostRecord& record) {
    auto p = encode(record);
    raw.write(Header{.type = msg::kShmOffer, .payload_bytes = p.size()}, p);
    ShmAnswer answer;
    EXPECT_TRUE(decode(raw.read_message(msg::kShmAnswer), &answer).is_ok());
    return answer;
  }
  // The whole setup, honestly.
  void setup() {
    Status st = ShmSegment::create(64 << 10, "/dev/shm", &mine);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ShmAnswer a = offer(mine->record());
    ASSERT_TRUE(a.accepted) << a.reason;
    st = ShmSegment::open(a.ring, "/dev/shm", &theirs);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    raw.write(Header{.type = msg::kShmConfirm}, {});
  }
  void frame(uint16_t type, uint64_t offset, uint64_t length = 0) {
    raw.write(Header{.type = type, .offset = offset, .length = length}, {});
  }
  RawClient raw;
  std::unique_ptr<ShmSegment> mine, theirs;
};

TEST(ShmTransport, AnHonestHandDrivenPeerIsServed) {
  Sink a(shm_config(Role::kServer, 0));
  RawShmPeer p(a.t.port());
  ASSERT_NO_FATAL_FAILURE(p.setup());
  auto data = pattern(100000, 9);
  p.mine->write(0, data.data(), 60000);
  p.raw.write(Header{.type = kData, .net_flags = kNetFlagShmPayload, .payload_bytes = data.size()},
              {});
  p.frame(msg::kShmPiece, 0, 60000);
  ASSERT_TRUE(wait_until([&] { return a.count() == 0; }));
  p.mine->write(60000, data.data() + 60000, 40000);  // wraps the 64 KiB ring
  p.frame(msg::kShmPiece, 60000, 40000);
  ASSERT_TRUE(wait_until([&] { return a.count() == 1; }));
  std::lock_guard l(a.mu);
  ASSERT_EQ(a.got[0].payload.size(), data.size());
  EXPECT_EQ(0, std::memcmp(a.got[0].payload.data(), data.data(), data.size()));
  EXPECT_TRUE(a.closes.empty());
}

TEST(ShmTransport, APeerThatDiesMidPayloadClosesOnlyItsConnection) {
  Sink a(shm_config(Role::kServer, 0));
  RawShmPeer p(a.t.port());
  ASSERT_NO_FATAL_FAILURE(p.setup());
  ASSERT_TRUE(wait_until([&] { return a.npeers() == 1; }));
  ConnId back = a.peers[0].first;
  std::vector<std::byte> dst(1 << 20);
  std::promise<Status> failed;
  ASSERT_TRUE(a.t.post_recv(back, {kData, 1, 0}, dst.data(), dst.size(),
                            [&](const Status& s, const Header&) { failed.set_value(s); })
                  .is_ok());
  auto data = pattern(1 << 20, 1);
  p.mine->write(0, data.data(), 32 << 10);
  p.raw.write(Header{.type = kData,
                     .request_id = 1,
                     .net_flags = kNetFlagShmPayload,
                     .payload_bytes = data.size()},
              {});
  p.frame(msg::kShmPiece, 0, 32 << 10);
  p.raw.close();  // gone with most of the payload unsent
  auto f = failed.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_FALSE(f.get().is_ok());
  ASSERT_TRUE(wait_until([&] { return a.ncloses() == 1; }));
  EXPECT_EQ(a.count(), 0u);
  // The node goes on serving others.
  MessageTransport b(shm_config(Role::kWorker, 2));
  b.start();
  ConnId c = b.connect("127.0.0.1", a.t.port());
  ASSERT_TRUE(b.send_copy(c, Header{.type = kData}, data.data(), data.size()).is_ok());
  ASSERT_TRUE(wait_until([&] { return a.count() == 1; }));
}

TEST(ShmTransport, ASenderThatStopsMidPayloadFailsTheReceiveWithoutHanging) {
  Sink a(shm_config(Role::kServer, 0));
  auto b = std::make_unique<MessageTransport>(shm_config(Role::kWorker, 1));
  b->start();
  ConnId c = b->connect("127.0.0.1", a.t.port());
  ASSERT_TRUE(wait_until([&] { return a.npeers() == 1; }));
  ConnId back = a.peers[0].first;
  const size_t n = 64 << 20;
  std::vector<std::byte> src(n, std::byte{1}), dst(n);
  std::promise<Status> recv;
  ASSERT_TRUE(a.t.post_recv(back, {kData, 1, 0}, dst.data(), n,
                            [&](const Status& s, const Header&) { recv.set_value(s); })
                  .is_ok());
  std::promise<Status> sent;
  b->send(c, Header{.type = kData, .request_id = 1}, src.data(), n,
          [&](const Status& s) { sent.set_value(s); });
  b.reset();  // stops mid-payload (64 MiB through a 64 KiB ring takes a while)
  auto sf = sent.get_future();
  ASSERT_EQ(sf.wait_for(10s), std::future_status::ready);
  auto rf = recv.get_future();
  ASSERT_EQ(rf.wait_for(10s), std::future_status::ready);
  // Either it made it before the stop, or both sides failed cleanly.
  EXPECT_EQ(sf.get().is_ok(), rf.get().is_ok());
}

// Each of these lies closes the connection (and only it).
TEST(ShmTransport, PeersThatLieAreRefused) {
  Sink a(shm_config(Role::kServer, 0));
  auto expect_closed = [&](RawShmPeer& p, size_t closes) {
    EXPECT_TRUE(p.raw.closed_by_peer());
    EXPECT_TRUE(wait_until([&] { return a.ncloses() == closes; }));
  };
  {  // A confirmation with a payload.
    RawShmPeer p(a.t.port());
    std::unique_ptr<ShmSegment> mine;
    Status st = ShmSegment::create(64 << 10, "/dev/shm", &mine);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ShmAnswer ans = p.offer(mine->record());
    ASSERT_TRUE(ans.accepted) << ans.reason;
    const std::vector<std::byte> junk(32);
    p.raw.write(Header{.type = msg::kShmConfirm, .payload_bytes = junk.size()}, junk);
    expect_closed(p, 1);
  }
  {  // A shared-memory payload without the setup.
    RawShmPeer p(a.t.port());
    p.raw.write(Header{.type = kData, .net_flags = kNetFlagShmPayload, .payload_bytes = 10}, {});
    expect_closed(p, 2);
  }
  {  // A piece at a position that was never announced.
    RawShmPeer p(a.t.port());
    ASSERT_NO_FATAL_FAILURE(p.setup());
    p.raw.write(Header{.type = kData, .net_flags = kNetFlagShmPayload, .payload_bytes = 10}, {});
    p.frame(msg::kShmPiece, 4096, 10);
    expect_closed(p, 3);
  }
  {  // A piece longer than the payload.
    RawShmPeer p(a.t.port());
    ASSERT_NO_FATAL_FAILURE(p.setup());
    p.raw.write(Header{.type = kData, .net_flags = kNetFlagShmPayload, .payload_bytes = 10}, {});
    p.frame(msg::kShmPiece, 0, 11);
    expect_closed(p, 4);
  }
  {  // Another message inside a shared-memory payload.
    RawShmPeer p(a.t.port());
    ASSERT_NO_FATAL_FAILURE(p.setup());
    p.raw.write(Header{.type = kData, .net_flags = kNetFlagShmPayload, .payload_bytes = 10}, {});
    p.raw.write(Header{.type = kData}, {});
    expect_closed(p, 5);
  }
  {  // A release of bytes never written.
    RawShmPeer p(a.t.port());
    ASSERT_NO_FATAL_FAILURE(p.setup());
    p.frame(msg::kShmRelease, 1);
    expect_closed(p, 6);
  }
  {  // A second offer.
    RawShmPeer p(a.t.port());
    ASSERT_NO_FATAL_FAILURE(p.setup());
    auto offer = encode(p.mine->record());
    p.raw.write(Header{.type = msg::kShmOffer, .payload_bytes = offer.size()}, offer);
    expect_closed(p, 7);
  }
  EXPECT_EQ(a.count(), 0u);
}

// The offer is a host record, judged by transport::verify (transport/host_identity.h;
// its refusals one by one: tests/net/host_proof_test.cpp): every record it
// cannot prove is declined and the connection goes on over TCP.
TEST(ShmTransport, AnOfferIsJudgedByTheOneHostProof) {
  Sink a(shm_config(Role::kServer, 0));
  TempShmDir dir;
  std::vector<std::unique_ptr<ShmSegment>> segs(5);
  for (auto& s : segs) {
    Status st = ShmSegment::create(64 << 10, "/dev/shm", &s);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  std::vector<HostRecord> offers;
  for (auto& s : segs)
    offers.push_back(s->record());
  offers[1].key = "00000000-0000-0000-0000-000000000000|elsewhere|net 4:1|pid 4:2";
  offers[2].key = host_key(dir.path);    // another segment directory
  offers[3].content[0] ^= std::byte{1};  // forged: the file is there, the content is not
  offers[4].file[0] ^= std::byte{1};     // a file that is not there
  const std::vector<std::string> why = {"", "another host", "another host", "does not hold",
                                        "cannot open"};
  std::vector<std::unique_ptr<RawShmPeer>> peers;
  for (size_t i = 0; i < offers.size(); ++i) {
    peers.push_back(std::make_unique<RawShmPeer>(a.t.port(), 7 + static_cast<int>(i)));
    ShmAnswer ans = peers.back()->offer(offers[i]);
    EXPECT_EQ(ans.accepted, i == 0) << i << " " << ans.reason;
    EXPECT_NE(ans.reason.find(why[i]), std::string::npos) << i << " " << ans.reason;
  }
  const char text[] = "still here";
  for (size_t i = 1; i < peers.size(); ++i)
    peers[i]->raw.write(Header{.type = kData, .payload_bytes = sizeof text},
                        std::as_bytes(std::span(text, sizeof text)));
  ASSERT_TRUE(wait_until([&] { return a.count() == peers.size() - 1; }));
  EXPECT_EQ(a.ncloses(), 0u);
}

}  // namespace
}  // namespace pushpull::transport
