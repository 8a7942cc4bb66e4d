// SPDX-License-Identifier: Apache-2.0
// The one way pushpull opens a file it writes (timeline, metrics, launcher
// and supervisor logs, checkpoints, optimizer states, the srun command
// file): never through a symbolic link, created private to this user, and
// never truncating or replacing a file that another user owns.
//
// Why: the names are predictable (`PUSHPULL_TIMELINE=/tmp/t` gives
// /tmp/t.worker0.json, checkpoints are round-NNNNNNNNNN/server-K.ppckpt) and
// often live in shared directories; another local user who plants a
// symlink or a file of their own at such a name must not make the job
// overwrite a file of its user, nor read what the job writes there.
//
// - every open uses O_NOFOLLOW | O_CLOEXEC; a symlink at the final name is
//   refused (streaming files) or replaced, never followed (atomic writes);
// - a symlink another user (not root) owns on the way to the file or
//   directory (a directory of the path planted as a link in /tmp) is
//   refused: what fs.protected_symlinks would do, when it is on;
// - new files are created with mode 0600, new directories with 0700;
// - an existing file is truncated only when it is a regular file owned by
//   this effective user with a single link (a hard link could point at a
//   file elsewhere); its mode is then set to 0600;
// - a file that replaces another is written to a fresh temporary file
//   (O_EXCL, random name, same directory) and renamed over it, so readers
//   see the old or the new content, never a torn one.
//
// Errors are IoError naming the path and the reason.
// Thread safety: the functions keep no state; callers own what they return.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace pushpull::base {

// Opens `path` for writing from its start (created 0600, or an existing
// file of this user truncated; see above). Returns the descriptor, which
// the caller owns. `what` names the file's purpose in errors ("timeline").
int open_private_for_write(const std::string& path, std::string_view what);

// The same as a stdio stream ("w"); the caller fcloses it.
std::FILE* fopen_private(const std::string& path, std::string_view what);

// Replaces `path` with `bytes` atomically: a temporary file in the same
// directory (O_EXCL, 0600), fsync'd when `durable` (then the directory too,
// so the rename survives a crash), renamed over `path`. Refuses when `path`
// exists and belongs to another user. The temporary file never survives a
// failure.
void write_private_file(const std::string& path, std::string_view bytes, std::string_view what,
                        bool durable = true);

// Creates directory `dir` and its missing parents with mode 0700 (existing
// ones are kept as they are). Refuses when `dir` exists but is not a
// directory, or is owned by a user other than this one or root (that user
// could swap what is inside it), and when `dir` or any directory on its way
// is a symbolic link owned by another user than this one or root (planted),
// before anything is created.
void make_private_dirs(const std::string& dir, std::string_view what);

}  // namespace pushpull::base
