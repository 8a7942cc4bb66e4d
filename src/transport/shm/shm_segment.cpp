// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/shm_segment.h"

#include <unistd.h>

#include <array>

#include <fmt/format.h>

#include "transport/wire.h"

namespace pushpull::transport {
namespace {

constexpr uint64_t kSegMagic = 0x4d485354454e5050;  // "PPNETSHM"
constexpr uint32_t kSegVersion = 2;                 // 1: a 32-byte token its peer repeated
// A segment is its own proof file: the content lies in the header.
constexpr ProofForm kSegmentForm{kShmSegmentKind, kShmHeaderBytes + kShmMinRingBytes,
                                 kShmHeaderBytes + kShmMaxRingBytes, 24};
static_assert(kSegmentForm.content_at + sizeof(ShmId) <= kShmHeaderBytes);

// Whether the segment file open as `fd` names a creator pid that no longer
// exists, or has no header at all: its creator died between creating the
// name and writing the header, microseconds that the sweep's two minutes
// long exceed.
bool creator_gone(int fd) {
  std::array<std::byte, 16> head{};
  if (::pread(fd, head.data(), head.size(), 0) != 16) return true;
  if (load_le<uint64_t>(head.data()) != kSegMagic) return true;
  return process_gone(static_cast<int>(load_le<uint32_t>(head.data() + 12)));
}

}  // namespace

ShmSegment::ShmSegment(std::unique_ptr<ShmFile> file)
    : file_(std::move(file)),
      ring_(file_->data() + kShmHeaderBytes, file_->size() - kShmHeaderBytes) {}

int ShmSegment::sweep_stale(const std::string& dir, std::chrono::seconds older_than,
                            std::chrono::seconds orphan_after) {
  return ShmFile::sweep_stale(dir, kShmSegmentKind, older_than, orphan_after, creator_gone);
}

bool ShmSegment::valid_name(const std::string& name) {
  return ShmFile::valid_name(name, kShmSegmentKind);
}

Status ShmSegment::create(size_t ring_bytes, const std::string& dir,
                          std::unique_ptr<ShmSegment>* out) {
  if (ring_bytes < kShmMinRingBytes || ring_bytes > kShmMaxRingBytes || ring_bytes % 4096 != 0) {
    return {ErrorCode::kInvalidArgument,
            fmt::format("ring size {} is not a multiple of 4 KiB in [{}, {}]", ring_bytes,
                        kShmMinRingBytes, kShmMaxRingBytes)};
  }
  std::unique_ptr<ShmFile> file;
  // Populated now, at the setup: otherwise every first pass over the ring
  // takes a page fault per 4 KiB on both sides, on the message path.
  if (Status st = ShmFile::create(dir, kShmSegmentKind, kShmHeaderBytes + ring_bytes,
                                  ShmMapping{.writable = true, .populate = true}, &file);
      !st)
    return st;
  std::unique_ptr<ShmSegment> s(new ShmSegment(std::move(file)));
  std::byte* base = s->file_->data();
  store_le<uint64_t>(base, kSegMagic);
  store_le<uint32_t>(base + 8, kSegVersion);
  store_le<uint32_t>(base + 12, static_cast<uint32_t>(::getpid()));  // for sweep_stale
  store_le<uint64_t>(base + 16, ring_bytes);
  s->record_ = prove(dir, *s->file_, kSegmentForm);
  *out = std::move(s);
  return Status::ok();
}

Status ShmSegment::open(const HostRecord& peer, const std::string& dir,
                        std::unique_ptr<ShmSegment>* out) {
  std::unique_ptr<ShmFile> file;
  if (Status st =
          verify(dir, peer, kSegmentForm, ShmMapping{.writable = false, .populate = true}, &file);
      !st)
    return st;
  const std::byte* base = file->data();
  const uint64_t ring = load_le<uint64_t>(base + 16);
  if (load_le<uint64_t>(base) != kSegMagic || load_le<uint32_t>(base + 8) != kSegVersion ||
      ring != file->size() - kShmHeaderBytes || ring % 4096 != 0) {
    return {ErrorCode::kProtocolError,
            fmt::format("{}/{} has no valid pushpull segment header", dir, file->name())};
  }
  out->reset(new ShmSegment(std::move(file)));
  return Status::ok();
}

}  // namespace pushpull::transport
