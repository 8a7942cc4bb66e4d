// SPDX-License-Identifier: Apache-2.0
// The key that authenticates the files pushpull writes for a user to read back
// later: parameter-server checkpoints (ps/checkpoint.h) and distributed
// optimizer-state files (docs/ps.md, "Checkpoints"; docs/security.md).
//
// The key is derived from a secret only this user can read:
// PUSHPULL_CHECKPOINT_KEY_FILE when set (a file like the per-user secret:
// yours, mode 0600, not a symbolic link), else the per-user secret file
// (base/secret_file.h: $PUSHPULL_SECRET_FILE, ~/.config/pushpull/secret,
// created on first use). Never the job secret: the launcher makes a fresh one
// per job, and a checkpoint must be readable by the next job.
//
//   key = HMAC-SHA256(secret, "pushpull checkpoint v2")      (32 bytes)
//   id  = HMAC-SHA256(key, "pushpull checkpoint key id")[0..8]
//
// A file carries HMAC-SHA256(key, every byte before the tag) as its last 32
// bytes, and the key id in its header: the id is not secret (it reveals
// nothing of the key) and only tells a file of another key ("written by
// another user or with another secret") from a modified one.
//
// Thread safety: free functions and plain values.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "pushpull/options.h"

namespace pushpull::base {

constexpr size_t kFileTagBytes = 32;   // HMAC-SHA256
constexpr size_t kFileKeyIdBytes = 8;  // in a file's header

struct FileKey {
  std::string key;          // 32 bytes; empty: no key (nothing can be written or read)
  std::string id;           // kFileKeyIdBytes bytes
  std::string source;       // where the secret came from, for messages
  std::string secret_path;  // the file the secret was read from ("" for a literal secret)
  // PUSHPULL_ALLOW_INSECURE=1: files of the unauthenticated format (checkpoint
  // version 1) are read, with a warning. Files with a tag are always checked.
  bool allow_unauthenticated = false;

  std::string id_hex() const;
  // HMAC-SHA256 of `bytes` under the key (kFileTagBytes bytes).
  std::string tag(std::string_view bytes) const;
  // Whether `tag` is the tag of `bytes` (constant time).
  bool verify(std::string_view bytes, std::string_view tag) const;
  // "key id ..., from <source>", for messages.
  std::string describe() const;
  // The end of an error for a file of another key: how to make every host
  // derive the same one.
  std::string mismatch_hint() const;
};

// The key of `secret` (any bytes, non-empty); `source` names it in messages.
FileKey file_key_from_secret(std::string_view secret, std::string source,
                             std::string secret_path = {});

// The checkpoint key of this process: PUSHPULL_CHECKPOINT_KEY_FILE, else the
// per-user secret file (created on first use); allow_unauthenticated from
// PUSHPULL_ALLOW_INSECURE. Throws IoError or InvalidArgument (the secret file
// is unusable), naming the file.
FileKey checkpoint_key(const Environment& env);

// PUSHPULL_CHECKPOINT_KEY_ID, set by `pushpull launch` for its servers (the
// launcher's key id): throws InvalidArgument when this process's key differs,
// so a server on a host with another secret stops at start-up instead of
// writing checkpoints the launcher will refuse to resume from. Unset: nothing
// is checked.
void check_key_id(const FileKey& key, const Environment& env, std::string_view who);

}  // namespace pushpull::base
