// SPDX-License-Identifier: Apache-2.0
#include "collective/shm_data_transport.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "net/hello.h"
#include "pushpull/log.h"

namespace pushpull::collective {
namespace {

constexpr uint64_t kShmTokenTag = kControlTagBit | 0x53484d544f4bull;  // "SHMTOK"

bool is_control(uint64_t tag) {
  return (tag & kControlTagBit) != 0;
}

}  // namespace

ShmDataTransport::ShmDataTransport(std::unique_ptr<TcpTransport> tcp,
                                   std::unique_ptr<ShmTransport> shm)
    : tcp_(std::move(tcp)), shm_(std::move(shm)) {
  // A weak reference: the hook may run (from TCP's threads) while this
  // object is being destroyed; the TCP transport is closed first anyway.
  tcp_->on_verdict([weak = std::weak_ptr<ShmTransport>(shm_)](const Status& verdict) {
    if (auto shm = weak.lock()) shm->declare(verdict);
  });
}

ShmDataTransport::~ShmDataTransport() {
  close(Status(ErrorCode::kPeerFailure,
               fmt::format("collective: rank {} closed its transport", tcp_->rank())));
}

void ShmDataTransport::post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                                 Completion done) {
  if (is_control(tag))
    tcp_->post_send(peer, tag, data, bytes, std::move(done));
  else
    shm_->post_send(peer, tag, data, bytes, std::move(done));
}

void ShmDataTransport::post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) {
  if (is_control(tag))
    tcp_->post_recv(peer, tag, dst, bytes, std::move(done));
  else
    shm_->post_recv(peer, tag, dst, bytes, std::move(done));
}

void ShmDataTransport::close(const Status& reason) {
  tcp_->close(reason);  // says goodbye first: the peers do not suspect this rank
  shm_->close(reason);
}

void ShmDataTransport::abort(const Status& why) {
  tcp_->abort(why);  // the verdict reaches the peers (and shm_, through the hook)
  shm_->close(why);
}

std::unique_ptr<Transport> use_shared_memory(std::unique_ptr<TcpTransport> tcp,
                                             const std::vector<std::pair<std::string, int>>& book,
                                             bool enabled, Millis startup) {
  if (!enabled || book.size() < 2) return tcp;
  for (const auto& [host, port] : book)
    if (host != book[0].first) return tcp;  // not all on one host: TCP only
  const int rank = tcp->rank(), size = tcp->size();
  const auto deadline = Clock::now() + startup;
  // Rank 0's random token names the job's segments (unguessable, fresh).
  net::Nonce token{};
  if (rank == 0) {
    token = net::random_nonce();
    std::vector<Request> sends;
    for (int p = 1; p < size; ++p)
      sends.push_back(isend(*tcp, p, kShmTokenTag, token.data(), token.size()));
    for (auto& s : sends)
      s.wait(deadline, "collective: shared-memory segment name");
  } else {
    irecv(*tcp, 0, kShmTokenTag, token.data(), token.size())
        .wait(deadline, "collective: shared-memory segment name from rank 0");
  }
  std::string prefix = "pushpull-";
  for (auto b : token)
    prefix += fmt::format("{:02x}", static_cast<unsigned>(b));
  ShmOptions o;
  o.connect_timeout = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  auto shm = std::make_unique<ShmTransport>(rank, size, prefix, o);
  PP_INFO("collective: rank {} moves data through shared memory ({} ranks on {})", rank, size,
          book[0].first);
  return std::make_unique<ShmDataTransport>(std::move(tcp), std::move(shm));
}

}  // namespace pushpull::collective
