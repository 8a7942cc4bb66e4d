// SPDX-License-Identifier: Apache-2.0
// The one same-host proof of both engines (transport/host_identity.h): a
// record survives the wire and malformed ones are refused; verify() accepts
// a record only for the file its maker made here, with the content it
// wrote, and refuses, in this one place, another host's key, a missing file
// (an old record replayed after its file went), other content, another
// size, a symlink, a FIFO, a file open to others and another user's file.
// The PS's offer (tests/net/shm_peers_test.cpp, AnOfferIsJudgedByTheOneHostProof),
// the PS's answer (below: a connector closes on a forged one) and the
// collectives' probes (tests/collective/shm_host_test.cpp) are judged by it.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "fixture.h"
#include "support/wait.h"
#include "transport/host_identity.h"
#include "transport/shm/shm_setup.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::transport {
namespace {

constexpr ProofForm kForm{ShmKind{"pushpull-prooftest-", 32}, 64, 4096, 40};

// A private directory on tmpfs, emptied and removed at the end.
struct ProofDir {
  ProofDir() {
    char t[] = "/dev/shm/pushpull-proof-XXXXXX";
    EXPECT_NE(::mkdtemp(t), nullptr);
    path = t;
  }
  ~ProofDir() {
    for (const std::string& n : made)
      ::unlink(n.c_str());
    ::rmdir(path.c_str());
  }
  std::string at(const HostRecord& r) const {
    return path + "/" + std::string(kForm.kind.prefix) + to_hex(r.file.data(), 16);
  }
  // A proven file of `bytes` and its record.
  HostRecord make(std::unique_ptr<ShmFile>* file, size_t bytes = 128) {
    Status st = ShmFile::create(path, kForm.kind, bytes, ShmMapping{.writable = true}, file);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return prove(path, **file, kForm);
  }
  std::string path;
  std::vector<std::string> made;
};

Status check(const ProofDir& d, const HostRecord& r) {
  std::unique_ptr<ShmFile> f;
  Status st = verify(d.path, r, kForm, ShmMapping{}, &f);
  EXPECT_EQ(st.is_ok(), f != nullptr);
  return st;
}

TEST(HostProof, RecordsRoundTripAndMalformedOnesAreRefused) {
  HostRecord r{.key = host_key("/dev/shm")};
  r.file[0] = std::byte{1};
  r.content[15] = std::byte{2};
  auto wire = encode(r);
  ASSERT_EQ(wire.size(), kHostRecordBytes);
  HostRecord back;
  ASSERT_TRUE(decode(wire, &back).is_ok());
  EXPECT_EQ(back, r);
  for (size_t cut = 0; cut < wire.size(); ++cut)
    EXPECT_EQ(decode(std::span(wire).first(cut), &back).code(), ErrorCode::kProtocolError) << cut;
  auto longer = wire;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(decode(longer, &back).is_ok());
  auto version = wire;
  version[0] = std::byte{1};  // the collectives' old record
  EXPECT_FALSE(decode(version, &back).is_ok());
  auto pad = wire;
  pad.back() = std::byte{1};
  EXPECT_FALSE(decode(pad, &back).is_ok());
  // A key longer than a record holds is cut, as host_key() cuts its own.
  ASSERT_TRUE(decode(encode(HostRecord{.key = std::string(300, 'k')}), &back).is_ok());
  EXPECT_EQ(back.key, std::string(255, 'k'));
  EXPECT_LE(host_key("/dev/shm").size(), 255u);
}

TEST(HostProof, AProvenRecordIsAcceptedWithItsFileAndContent) {
  ProofDir d;
  std::unique_ptr<ShmFile> mine;
  const HostRecord r = d.make(&mine);
  EXPECT_EQ(r.key, host_key(d.path));
  EXPECT_EQ(r.file, mine->id());
  EXPECT_EQ(0, std::memcmp(mine->data() + kForm.content_at, r.content.data(), 16));
  std::unique_ptr<ShmFile> seen;
  ASSERT_TRUE(verify(d.path, r, kForm, ShmMapping{}, &seen).is_ok());
  EXPECT_EQ(seen->size(), 128u);
  EXPECT_EQ(seen->name(), mine->name());
  // Each proof is fresh: a second file of this process proves with other content.
  std::unique_ptr<ShmFile> second;
  EXPECT_NE(d.make(&second).content, r.content);
}

TEST(HostProof, EveryRefusalIsMadeHere) {
  ProofDir d;
  std::unique_ptr<ShmFile> mine;
  const HostRecord good = d.make(&mine);
  ASSERT_TRUE(check(d, good).is_ok());

  HostRecord other = good;  // another host: refused before anything is opened
  other.key = host_identity();
  EXPECT_NE(check(d, other).message().find("another host"), std::string::npos);
  other.key = host_key("/dev/shm");  // another segment directory
  EXPECT_EQ(check(d, other).code(), ErrorCode::kIoError);

  HostRecord forged = good;  // the file is there, the content is not
  forged.content[0] ^= std::byte{1};
  Status st = check(d, forged);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("does not hold"), std::string::npos) << st.message();

  HostRecord missing = good;  // no such file
  missing.file[0] ^= std::byte{1};
  EXPECT_EQ(check(d, missing).code(), ErrorCode::kNotFound);

  std::unique_ptr<ShmFile> small;  // another size
  EXPECT_EQ(check(d, d.make(&small, 32)).code(), ErrorCode::kProtocolError);

  // A record replayed after its file went: its name is gone, and a new
  // file never has it.
  std::unique_ptr<ShmFile> old_file;
  const HostRecord old = d.make(&old_file);
  old_file.reset();
  EXPECT_EQ(check(d, old).code(), ErrorCode::kNotFound);

  // At a record's name: a symlink to a proven file, a FIFO, a file open to
  // others (its content right each time).
  uint8_t names = 0;
  auto at_name = [&](const char* what, auto make_it) {
    HostRecord r = good;
    r.file[15] ^= std::byte{++names};
    const std::string p = d.at(r);
    d.made.push_back(p);
    make_it(p);
    EXPECT_EQ(check(d, r).code(), ErrorCode::kIoError) << what;
  };
  at_name("a symlink",
          [&](const std::string& p) { ASSERT_EQ(::symlink(d.at(good).c_str(), p.c_str()), 0); });
  at_name("a FIFO", [&](const std::string& p) { ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0); });
  auto copy_of_good = [&](const std::string& p, mode_t mode) {
    const int fd = ::open(p.c_str(), O_CREAT | O_EXCL | O_RDWR, mode);
    ASSERT_GE(fd, 0) << p;
    ASSERT_EQ(::fchmod(fd, mode), 0);  // past the umask
    ASSERT_EQ(::write(fd, mine->data(), mine->size()), static_cast<ssize_t>(mine->size()));
    ::close(fd);
  };
  at_name("open to others", [&](const std::string& p) { copy_of_good(p, 0644); });
  if (::geteuid() == 0) {
    at_name("another user's", [&](const std::string& p) {
      copy_of_good(p, 0600);
      ASSERT_EQ(::chown(p.c_str(), 65534, 65534), 0);
    });
  }
  ASSERT_TRUE(check(d, good).is_ok());  // the honest record still proves
}

// An acceptor on a raw socket: the hello (no secret), then it answers the
// connector's offer with its own ring's record, forged or not, and reports
// what came back: the confirmation (type 6) or 0 when the connector closed.
uint16_t answer_offer(Fd& listener, bool forge) {
  Fd fd(::accept(listener.get(), nullptr, nullptr));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  auto send = [&](uint16_t type, const std::vector<std::byte>& payload) {
    auto hb = encode_header(Header{.type = type, .payload_bytes = payload.size()});
    EXPECT_TRUE(write_all(fd.get(), hb.data(), hb.size(), deadline).is_ok());
    EXPECT_TRUE(write_all(fd.get(), payload.data(), payload.size(), deadline).is_ok());
  };
  auto receive = [&](std::vector<std::byte>* payload) -> uint16_t {
    HeaderBytes hb;
    Header h;
    if (!read_all(fd.get(), hb.data(), hb.size(), deadline) ||
        !decode_header(hb, kMaxShmSetupBytes, &h))
      return 0;
    payload->resize(h.payload_bytes);
    return read_all(fd.get(), payload->data(), payload->size(), deadline) ? h.type : 0;
  };
  send(msg::kChallenge, encode(Challenge{kProtocolVersion, job_tag("job"), random_nonce()}));
  std::vector<std::byte> p;
  EXPECT_EQ(receive(&p), msg::kHello);
  send(msg::kHelloAck, encode(HelloAck{true, "", Role::kServer, 0, {}}));
  HostRecord offer;
  EXPECT_EQ(receive(&p), msg::kShmOffer);
  EXPECT_TRUE(decode(p, &offer).is_ok());
  std::unique_ptr<ShmSegment> theirs;
  EXPECT_TRUE(ShmSegment::open(offer, "/dev/shm", &theirs).is_ok());
  std::unique_ptr<ShmSegment> mine;
  EXPECT_TRUE(ShmSegment::create(kShmMinRingBytes, "/dev/shm", &mine).is_ok());
  ShmAnswer answer{true, "", mine->record()};
  if (forge) answer.ring.content[5] ^= std::byte{1};
  send(msg::kShmAnswer, encode(answer));
  return receive(&p);
}

// The connector verifies the acceptor's answer as the acceptor verified its
// offer: a forged record closes that connection (the acceptor may already
// send through its ring), an honest one is confirmed.
TEST(HostProof, APsConnectorClosesOnAForgedAnswer) {
  for (bool forge : {true, false}) {
    Fd listener = listen_on("127.0.0.1", 0);
    set_nonblocking(listener.get(), false);
    uint16_t reply = 0;
    std::thread acceptor([&] { reply = answer_offer(listener, forge); });
    TransportConfig c = test::config(Role::kWorker, 1);
    c.shared_memory = true;
    c.shm_ring_bytes = kShmMinRingBytes;
    test::Sink b(std::move(c));
    b.t.connect("127.0.0.1", local_port(listener.get()));
    if (forge) {
      EXPECT_TRUE(test::wait_until([&] { return b.ncloses() == 1; }));  // no ASSERT: join below
      std::lock_guard l(b.mu);
      for (const Status& st : b.closes)
        EXPECT_NE(st.message().find("does not hold"), std::string::npos) << st.to_string();
    }
    b.t.stop();
    acceptor.join();
    EXPECT_EQ(reply, forge ? 0 : msg::kShmConfirm) << forge;
  }
}

}  // namespace
}  // namespace pushpull::transport
