// SPDX-License-Identifier: Apache-2.0
// Host identity for shared memory (shm_host.h): records survive the wire and
// bad ones are refused, a probe is seen only where it really is
// (transport::verify, whose refusals tests/net/host_proof_test.cpp checks),
// and a group forms only when every member proved every other.
// use_shared_memory's choice: shm_use_test.cpp; squatted segment names:
// shm_squat_test.cpp.
#include "transport/shm/shm_host.h"

#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "shm_host_fixture.h"
#include "transport/shm/shm_segment.h"

namespace pushpull::collective {
namespace {

using namespace shm_testing;

TEST(ShmHost, RecordsRoundTripAndBadOnesAreRefused) {
  RankRecord r;
  r.host.key = host_key("/dev/shm");
  r.host.file[0] = std::byte{1};
  r.host.content[15] = std::byte{2};
  r.token[7] = 3;
  auto wire = encode(r);
  ASSERT_EQ(wire.size(), kRankRecordBytes);
  RankRecord back = decode_rank_record(wire.data(), wire.size());
  EXPECT_EQ(back.host, r.host);
  EXPECT_EQ(back.token, r.token);

  EXPECT_THROW(decode_rank_record(wire.data(), wire.size() - 1), ProtocolError);
  auto bad_host = wire;
  bad_host[0] ^= 1;  // the host record's version
  EXPECT_THROW(decode_rank_record(bad_host.data(), bad_host.size()), ProtocolError);
  auto other_token = wire;
  other_token.back() ^= 1;  // the token is anything
  EXPECT_NE(decode_rank_record(other_token.data(), other_token.size()).token, r.token);
}

TEST(ShmHost, TheKeyNamesTheKernelTheNamespacesAndTheDirectory) {
  TempDir a, b;
  std::string ka = host_key(a.path.string()), kb = host_key(b.path.string());
  EXPECT_NE(ka, kb);  // another directory: another "host"
  EXPECT_EQ(ka, host_key(a.path.string()));
  EXPECT_NE(ka.find("net "), std::string::npos);
  EXPECT_NE(ka.find("pid "), std::string::npos);
}

// Two network-namespace "hosts" of one kernel are two hosts (the links
// between them are what such a setup measures). Needs CAP_SYS_ADMIN.
TEST(ShmHost, AnotherNetworkNamespaceIsAnotherHost) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the test runs before any other thread exists (it is first to fork)
    ::close(fds[0]);
    std::string key = ::unshare(CLONE_NEWNET) == 0 ? host_key("/dev/shm") : "";
    (void)!::write(fds[1], key.data(), key.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    got.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (got.empty()) GTEST_SKIP() << "no permission to make a network namespace";
  const std::string mine = host_key("/dev/shm");
  EXPECT_NE(got, mine);
  // Only the network namespace differs.
  EXPECT_EQ(got.substr(0, got.find("|net ")), mine.substr(0, mine.find("|net ")));
  EXPECT_EQ(got.substr(got.find("|pid ")), mine.substr(mine.find("|pid ")));
}

TEST(ShmHost, AProbeIsSeenOnlyWhereItIsAndLeavesNothing) {
  TempDir a, b;
  {
    HostProbe pa(a.path.string()), pa2(a.path.string()), pb(b.path.string());
    EXPECT_TRUE(pa2.sees(pa.record()));
    EXPECT_FALSE(pb.sees(pa.record()));  // not in b's directory
    RankRecord forged = pa.record();
    forged.host.content[0] ^= std::byte{1};
    EXPECT_FALSE(pa2.sees(forged));  // the file is there, the content is not
    forged = pa.record();
    forged.host.key = host_key(b.path.string());
    EXPECT_FALSE(pa2.sees(forged));  // another host's key
    {  // A PS ring's record (the same proof, another kind of file) is no probe.
      std::unique_ptr<transport::ShmSegment> ring;
      ASSERT_TRUE(transport::ShmSegment::create(64 << 10, a.path.string(), &ring).is_ok());
      EXPECT_FALSE(pa2.sees(RankRecord{ring->record(), {}}));
    }
    EXPECT_TRUE(pa.reserve(1 << 16));
    EXPECT_EQ(a.entries(), 3u);          // two probes and pa's reservation
    EXPECT_TRUE(pa2.sees(pa.record()));  // the probe keeps its size
    pa.remove();
    EXPECT_EQ(a.entries(), 1u);  // the probe and its reservation went
    EXPECT_FALSE(pa2.sees(pa.record()));
  }
  EXPECT_EQ(a.entries(), 0u);
  EXPECT_EQ(b.entries(), 0u);
}

TEST(ShmHost, AGroupNeedsEveryProof) {
  std::vector<RankRecord> recs(4);
  recs[0].host.key = recs[1].host.key = recs[3].host.key = "host A";
  recs[2].host.key = "host B";
  std::vector<std::vector<uint8_t>> proof(4, std::vector<uint8_t>(4, 1));
  EXPECT_EQ(shm_group(recs, proof, 0), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(shm_group(recs, proof, 3), (std::vector<int>{0, 1, 3}));
  EXPECT_TRUE(shm_group(recs, proof, 2).empty());  // alone on its host
  proof[3][1] = 0;                                 // rank 3 cannot see rank 1's probe
  EXPECT_TRUE(shm_group(recs, proof, 0).empty());
  EXPECT_TRUE(shm_group(recs, proof, 1).empty());
  proof[3][1] = 1;
  proof[1][1] = 0;  // rank 1 could not reserve its segment
  EXPECT_TRUE(shm_group(recs, proof, 3).empty());
  proof[1] = {1, 1};  // a short row (a malformed proof) proves nothing
  EXPECT_TRUE(shm_group(recs, proof, 0).empty());
}

}  // namespace
}  // namespace pushpull::collective
