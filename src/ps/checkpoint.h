// SPDX-License-Identifier: Apache-2.0
// Parameter-server checkpoint files (docs/ps.md, "Checkpoints").
//
// Each server writes the key ranges it is home for to
//   DIR/round-<R, 10 digits>/server-<rank>.ppckpt
// every `--checkpoint-every` rounds; a round's checkpoint is complete when
// every server's file for it exists (a file appears only whole: written to
// a temporary name, fsynced, then renamed). Layout (little-endian), version 2:
//   magic "PPCKPT\0\0" | u32 version (2) | u8 key id[8] (base/file_auth.h)
//   | u32 servers | u32 rank | u32 workers | i64 round | u64 parts
//   per part: u64 key id | i64 begin | i32 home | u32 len, name
//             | u8 dtype | u8 ndim | i64 dims[ndim] | u64 bytes | data
//             | u64 len, optimizer states (Optimizer::save_key_states)
//   HMAC-SHA256 (32 bytes) of every byte before it, under the user's
//   checkpoint key (base::checkpoint_key: from the per-user secret file or
//   PUSHPULL_CHECKPOINT_KEY_FILE, never the job secret).
// Version 1 (no key id; a u64 FNV-1a checksum instead of the tag) is read
// only when the key allows unauthenticated files (PUSHPULL_ALLOW_INSECURE=1).
// Decoding verifies the tag before anything else, is bounds-checked, and
// throws IoError naming the file for a file of another key ("written by
// another user or with another secret"), a truncated, corrupt or modified
// one, and a foreign one (another server count, rank or worker count than
// the job's).
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/file_auth.h"
#include "pushpull/array.h"

namespace pushpull::ps {

struct CheckpointPart {
  uint64_t key = 0;
  int64_t begin = 0;
  int home = 0;
  std::string name;
  ArrayView value;  // kept alive and unchanged by `owner`
  std::shared_ptr<void> owner;
  std::string optimizer_states;  // "" without an optimizer
};

struct Checkpoint {
  int num_servers = 0;
  int rank = 0;
  int num_workers = 0;
  int64_t round = 0;
  std::vector<CheckpointPart> parts;
};

// What a job expects of a file (checked by decode_checkpoint).
struct CheckpointLayout {
  int num_servers = 0;
  int rank = 0;
  int num_workers = 0;
};

// Throws InvalidArgument without a key.
std::string encode_checkpoint(const Checkpoint& c, const base::FileKey& key);
// `source` names the file in errors.
Checkpoint decode_checkpoint(std::string_view bytes, std::string_view source,
                             const CheckpointLayout& expect, const base::FileKey& key);

std::string checkpoint_path(const std::string& dir, int64_t round, int rank);
// Writes `bytes` to `path` atomically (PATH.tmp, fsync, rename, fsync of the
// directory), creating the directory. Throws IoError.
void write_file_atomically(const std::string& path, std::string_view bytes);
Checkpoint read_checkpoint(const std::string& path, const CheckpointLayout& expect,
                           const base::FileKey& key);
// The highest round whose files exist for every server 0..num_servers-1;
// nullopt when none is complete.
std::optional<int64_t> last_complete_checkpoint(const std::string& dir, int num_servers);
// A job resumed from round `resumed` sets aside the rounds after it (the
// crashed run's incomplete ones): renamed to round-<N>.abandoned-<resumed>,
// so that a later crash cannot assemble a "complete" round from two runs'
// files. Returns the directories renamed. Throws IoError.
std::vector<std::string> set_aside_rounds_after(const std::string& dir, int64_t resumed);

}  // namespace pushpull::ps
