// SPDX-License-Identifier: Apache-2.0
// Writes the seed corpora of the fuzz targets from real encodings:
//   fuzz_seeds OUTDIR   ->  OUTDIR/<target>/seed-<n>
// Each seed is the target's selector byte (which decoder) followed by what
// the repository's own encoder produces, so the fuzzers start from valid
// messages and mutate from there.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/file_auth.h"
#include "cluster/protocol.h"
#include "collective/messages.h"
#include "collective/store.h"
#include "collective/tcp_store.h"
#include "compress/compressor.h"
#include "ps/checkpoint.h"
#include "ps/protocol.h"
#include "pushpull/optimizer.h"
#include "transport/hello.h"
#include "transport/host_identity.h"
#include "transport/message.h"
#include "transport/shm/lend.h"
#include "transport/shm/shm_host.h"
#include "transport/shm/shm_setup.h"
#include "transport/wire.h"

namespace fs = std::filesystem;
using namespace pushpull;

namespace {

class Corpus {
 public:
  Corpus(fs::path root, std::string target) : dir_(root / target) { fs::create_directories(dir_); }
  template <typename Bytes>
  void add(uint8_t selector, const Bytes& bytes) {
    std::ofstream f(dir_ / ("seed-" + std::to_string(n_++)), std::ios::binary);
    f.put(static_cast<char>(selector));
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  }

 private:
  fs::path dir_;
  int n_ = 0;
};

void net_seeds(const fs::path& root) {
  Corpus header(root, "fuzz_net_header");
  for (uint16_t type : {transport::msg::kHello, uint16_t{17}, uint16_t{65}, uint16_t{130}}) {
    transport::Header h{.type = type,
                        .sender = 9,
                        .request_id = 7,
                        .key = 3,
                        .length = 4000,
                        .payload_bytes = 4000};
    header.add(0, transport::encode_header(h));
    header.add(1, transport::encode_header(h));
  }
  Corpus hs(root, "fuzz_net_handshake");
  transport::Challenge c;
  c.version = transport::kProtocolVersion;
  c.nonce = transport::random_nonce();
  hs.add(0, transport::encode(c));
  transport::Hello h;
  h.version = transport::kProtocolVersion;
  h.role = Role::kWorker;
  h.rank = 1;
  h.host = "10.0.0.2";
  h.port = 9000;
  hs.add(1, transport::encode(h));
  // Hellos with proofs for fuzz_net_handshake's fixed job (selector 3):
  // a stream's and a message connection's, each right for its own kind.
  for (auto kind : {transport::HelloKind::kStream, transport::HelloKind::kMessages}) {
    transport::Hello p = h;
    p.job_tag = transport::job_tag("fuzz-job");
    p.kind = kind;
    transport::Nonce acceptor{};
    acceptor.fill(std::byte{0x5a});
    p.proof = transport::compute_proof("fuzz-secret", {transport::Direction::kConnector, acceptor,
                                                       p.nonce, "fuzz-job", p.role, p.rank, kind});
    hs.add(3, transport::encode(p));
  }
  hs.add(2, transport::encode(transport::HelloAck{true, "", Role::kServer, 0}));
  hs.add(2,
         transport::encode(transport::HelloAck{false, "authentication failed", Role::kNone, -1}));
  header.add(
      0, transport::encode_header(transport::Header{
             .type = 65, .net_flags = transport::kNetFlagShmPayload, .payload_bytes = 1 << 20}));
  Corpus shm(root, "fuzz_net_shm");
  const transport::HostRecord record{.key = transport::host_key("/dev/shm")};
  shm.add(0, transport::encode(record));
  shm.add(1, transport::encode(transport::ShmAnswer{true, "", record}));
  shm.add(1,
          transport::encode(transport::ShmAnswer{false, "shared memory is off on this node", {}}));
  shm.add(2,
          transport::encode_lend_ref(transport::LendRef{4242, 17, {}, 32 << 20, 2 << 20, 2 << 20}));
  const auto rank = transport::encode(transport::RankRecord{record, {}});
  shm.add(3, rank);
}

void cluster_seeds(const fs::path& root) {
  Corpus cl(root, "fuzz_cluster_messages");
  cluster::NodeAddress w{Role::kWorker, 1, "10.0.0.2", 9000};
  cl.add(0, cluster::encode_register(w, -1));
  cl.add(0, cluster::encode_register(w, 3));
  cluster::AddressBook book;
  book.scheduler = {Role::kScheduler, 0, "10.0.0.1", 9091};
  book.servers = {{Role::kServer, 0, "10.0.0.3", 9001}, {Role::kServer, 1, "10.0.0.4", 9002}};
  book.workers = {w, {Role::kWorker, 0, "::1", 9003}};
  cl.add(1, cluster::encode_book(1, book));
  cl.add(2, cluster::encode_dead(w, "connection closed"));
}

void ps_seeds(const fs::path& root) {
  Corpus ps(root, "fuzz_ps_messages");
  std::vector<std::byte> value(64, std::byte{1});
  ps.add(0, ps::encode_init("weight", value));
  ps.add(0, ps::encode_init("", {}));
  ps.add(1, ps::encode_ranges({{0, 10}, {20, 5}}));
  ps.add(1, ps::encode_ranges({}));
  ps::ReplicaState st;
  st.name = "weight";
  st.home = 1;
  st.applied_seq = {3, 4};
  st.optimizer_states = "momentum";
  ps.add(2, ps::encode_replica_meta(st));
  transport::LendRef ref{.pid = 42, .fd = 7, .block_bytes = 1 << 20, .offset = 4096, .bytes = 4000};
  ps.add(3, ps::encode_lent_replica(ref, st));
  st.behind = {0, 2};  // backup workers: rounds behind per worker
  ps.add(2, ps::encode_replica_meta(st));
  ps.add(3, ps::encode_lent_replica(ref, st));
}

// One request record of fuzz_ps_store.
void ps_record(transport::Writer& w, uint8_t op, uint8_t worker, DType dtype, uint8_t flags,
               uint64_t key, int64_t offset, int64_t length,
               const std::vector<std::byte>& payload) {
  w.u<uint8_t>(op).u<uint8_t>(worker).u<uint8_t>(static_cast<uint8_t>(dtype)).u<uint8_t>(flags);
  w.u<uint64_t>(key).u<int64_t>(offset).u<int64_t>(length);
  w.u<uint16_t>(static_cast<uint16_t>(payload.size())).bytes(payload);
}

// Compressed pulls: a round of valid 2bit and fp16 pushes to a 64-value
// key (answered compressed) for fuzz_ps_store, and real replies of every
// codec for fuzz_compress_reply.
void compress_seeds(const fs::path& root, Corpus& st) {
  Corpus reply(root, "fuzz_compress_reply");
  std::vector<float> g(64);
  for (size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
  std::vector<std::byte> value(64 * 4, std::byte{0});
  for (const char* type : {"2bit", "1bit", "fp16"}) {
    compress::Compressor c(compress::parse_settings({{"type", type}}));
    std::vector<std::byte> wire(c.encoded_bytes(g.size()));
    c.encode(1, 0, g.size(), 0, g.data(), g.size(), wire.data());
    transport::Writer w;
    ps_record(w, 0, 0, DType::kFloat32, 0, 1, 0, 64, ps::encode_init("c", value));
    ps_record(w, 1, 0, DType::kFloat32, 1, 1, 0, 64, wire);
    ps_record(w, 1, 0, DType::kFloat32, 1 | ps::msg::kFlagPullBack, 1, 0, 64, wire);
    ps_record(w, 2, 0, DType::kFloat32, 0, 1, 0, 0, {});
    st.add(0, w.data());
    std::vector<std::byte> r(2);
    const uint16_t n = static_cast<uint16_t>(g.size());
    std::memcpy(r.data(), &n, 2);
    r.insert(r.end(), wire.begin(), wire.end());
    reply.add(0, r);
  }
  // fuzz_compress_gathered: 3 ranks' real codes of 64 values, back to back
  // (selector: bit 0 the type, bits 2-4 ranks - 1).
  Corpus gathered(root, "fuzz_compress_gathered");
  for (const char* type : {"2bit", "1bit"}) {
    std::vector<std::byte> r(2);
    const uint16_t n = static_cast<uint16_t>(g.size());
    std::memcpy(r.data(), &n, 2);
    for (int rank = 0; rank < 3; ++rank) {
      compress::Compressor c(compress::parse_settings({{"type", type}}));
      std::vector<std::byte> wire(c.encoded_bytes(g.size()));
      c.encode(1, 0, g.size(), 0, g.data(), g.size(), wire.data());
      r.insert(r.end(), wire.begin(), wire.end());
    }
    gathered.add(static_cast<uint8_t>((std::string(type) == "1bit" ? 1 : 0) | 2 << 2), r);
  }
}

void ps_store_seeds(const fs::path& root) {
  Corpus st(root, "fuzz_ps_store");
  std::vector<std::byte> value(16, std::byte{0});
  std::vector<std::byte> grad(16, std::byte{0x3f});
  std::vector<std::byte> words(8, std::byte{0x55});  // 2-bit: threshold + one word
  for (uint8_t workers : {0, 1}) {
    transport::Writer w;
    ps_record(w, 0, 0, DType::kFloat32, 0, 1, 0, 4, ps::encode_init("w", value));
    for (uint8_t k = 0; k <= workers; ++k)
      ps_record(w, 1, k, DType::kFloat32, 0, 1, 0, 4, grad);
    ps_record(w, 1, 0, DType::kFloat32, 1, 1, 0, 4, words);
    ps_record(w, 1, 0, DType::kFloat32, ps::msg::kFlagPullBack, 1, 0, 4, grad);  // a pushpull
    ps_record(w, 2, 0, DType::kFloat32, 0, 1, 0, 0, {});
    ps_record(w, 2, 0, DType::kFloat32, 0, 1, 0, 0, ps::encode_ranges({{1, 2}}));
    st.add(workers, w.data());
  }
  compress_seeds(root, st);
}

void optimizer_seeds(const fs::path& root) {
  Corpus op(root, "fuzz_optimizer_states");
  const char* specs[] = {"sgd:learning_rate=0.1,momentum=0.9", "adam", "rmsprop", "adagrad"};
  for (uint8_t i = 0; i < 4; ++i) {
    auto opt = create_optimizer(OptimizerSpec::parse(specs[i]));
    Array w = Array::full(Shape{4}, 1.0), g = Array::full(Shape{4}, 0.5);
    opt->update(Key(1), w.view(), g.view());
    op.add(i, opt->save_states());
  }
}

// Checkpoints without their tag (fuzz_ps_checkpoint appends it under its
// fixed key, selector 0), and whole files (selector 1).
void checkpoint_seeds(const fs::path& root) {
  Corpus ck(root, "fuzz_ps_checkpoint");
  const base::FileKey key = base::file_key_from_secret("fuzz", "<fuzz key>");
  auto add = [&](const ps::Checkpoint& c) {
    const std::string file = ps::encode_checkpoint(c, key);
    ck.add(0, std::string_view(file).substr(0, file.size() - base::kFileTagBytes));
    ck.add(1, file);
  };
  ps::Checkpoint c{3, 1, 2, 8, {}};
  add(c);
  auto a = std::make_shared<Array>(Array::full(Shape{2, 2}, 1.5));
  auto h = std::make_shared<Array>(Array::full(Shape{3}, 2.0, DType::kFloat16));
  c.parts.push_back({7, 0, 1, "w", a->view(), a, ""});
  c.parts.push_back({9, 1000, 0, "big", h->view(), h, "states"});
  add(c);
}

// IDX files: a small image set, a label file, and the 65536^4 header whose
// dimension product wraps to 0 in unchecked size math.
void idx_seeds(const fs::path& root) {
  Corpus idx(root, "fuzz_data_idx");
  auto file = [](std::vector<uint32_t> dims, size_t data) {
    std::string b = {0, 0, 0x08, static_cast<char>(dims.size())};
    for (uint32_t d : dims)
      for (int s = 24; s >= 0; s -= 8)
        b.push_back(static_cast<char>(d >> s));
    for (size_t i = 0; i < data; ++i)
      b.push_back(static_cast<char>(i));
    return b;
  };
  idx.add(0, file({2, 3, 3}, 18));
  idx.add(0, file({5}, 5));
  idx.add(0, file({65536, 65536, 65536, 65536}, 0));
}

void collective_seeds(const fs::path& root) {
  Corpus co(root, "fuzz_collective_messages");
  collective::Spec s;
  s.name = "grad.0";
  s.shape = Shape{2, 3};
  collective::Spec b = s;
  b.type = collective::OpType::kBroadcast;
  b.root = 1;
  co.add(0 | (2 << 2), collective::encode(collective::Announce{{s, b}, {}, false}));
  co.add(0 | (2 << 2), collective::encode(collective::Announce{{}, {0, 1}, true}));
  collective::Response exec;
  exec.tensors = {{"grad.0", 0, true, s}, {"grad.1", 1, false, {}}};
  exec.joined = {2};
  collective::Response err;
  err.kind = collective::Response::Kind::kError;
  err.code = ErrorCode::kInvalidArgument;
  err.message = "mismatched shapes";
  collective::Response gather;
  gather.tensors = {{"ag", collective::kNoCacheId, true, s}};
  gather.rows = {1, 2, 3};
  co.add(1 | (2 << 2), collective::encode(std::vector<collective::Response>{exec, err, gather}));
  // A child's message in the negotiation tree (every input also goes
  // through decode_upward): rank 2 of 3's first submission, an aggregated
  // id with rank 2 joined, an id passed up rank by rank, a join.
  collective::Upward up;
  up.specs = {{2, s}};
  up.cached = {{0, true, 0, {2}}, {1, false, 1500, {2}}};
  up.joins = {2};
  co.add(0 | (2 << 2), collective::encode(up));

  Corpus rv(root, "fuzz_rendezvous");
  const collective::AddressList book{{"10.0.0.1", 9100}, {"10.0.0.2", 9101}, {"::1", 9102}};
  const auto entry = collective::encode_entry(3, "10.0.0.2", 9100);
  rv.add(0, collective::encode_store_request("rank/1", entry));  // a set
  rv.add(3, collective::encode_store_request("book", {}));       // a get (selector 3)
  rv.add(1, entry);
  rv.add(2, collective::encode_verdict({}, book));
  rv.add(2, collective::encode_verdict(Status(ErrorCode::kTimeout, "for ranks 2"), {}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds OUTDIR\n");
    return 2;
  }
  fs::path root = argv[1];
  net_seeds(root);
  cluster_seeds(root);
  ps_seeds(root);
  ps_store_seeds(root);
  optimizer_seeds(root);
  checkpoint_seeds(root);
  collective_seeds(root);
  idx_seeds(root);
  return 0;
}
