// SPDX-License-Identifier: Apache-2.0
// The file of a parameter-server job's optimizer states
// (DistStore::save_optimizer_states / load_optimizer_states): what every
// server's optimizer saved, authenticated like PS checkpoints
// (base/file_auth.h, docs/security.md). Layout (little-endian), version 2:
//   magic "PPDS" | u32 version (2) | u8 key id[8] | u32 servers
//   | per server: u64 length, the server's states (Optimizer::save_states)
//   | HMAC-SHA256 (32 bytes) of every byte before it, under the user's
//     checkpoint key (base::checkpoint_key: PUSHPULL_CHECKPOINT_KEY_FILE, else
//     the per-user secret file; never the job secret).
// Version 1 (no key id, no tag) is read only when the key allows
// unauthenticated files (PUSHPULL_ALLOW_INSECURE=1), with a warning, as
// checkpoints of version 1 are.
//
// Decoding checks the tag before it reads anything else and throws IoError
// naming the file: for a file of another key ("written by another user or
// with another secret"), a modified or truncated one ("authentication tag
// mismatch"), one that is not such a file, and a version 1 file without
// PUSHPULL_ALLOW_INSECURE=1; InvalidArgument for an authentic file of a job
// with another number of servers.
//
// Thread safety: free functions without shared state.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/file_auth.h"

namespace pushpull::kv {

// Throws InvalidArgument without a key.
std::string encode_states_file(const std::vector<std::string>& per_server,
                               const base::FileKey& key);
// Every server's states, in server order; `source` names the file in errors,
// `servers` is the job's server count.
std::vector<std::string> decode_states_file(std::string_view bytes, std::string_view source,
                                            int servers, const base::FileKey& key);

}  // namespace pushpull::kv
