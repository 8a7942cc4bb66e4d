// SPDX-License-Identifier: Apache-2.0
// The per-user job secret file: what authenticates a job that was given no
// PUSHPULL_JOB_SECRET (docs/security.md, "The job secret").
//
// Like an ssh key or MUNGE's key, the file holds 32 random bytes (OpenSSL
// RAND_bytes) hex-encoded on one line, mode 0600, in a 0700 directory, and is
// created on first use. Every process of a user that runs on this host (or on
// any host sharing the home directory) reads the same secret, so its jobs
// authenticate with nothing set by hand, while another local user cannot
// read it and so cannot join.
//
// Where it lives: $PUSHPULL_SECRET_FILE when set, else
// $XDG_CONFIG_HOME/pushpull/secret, else $HOME/.config/pushpull/secret (the
// passwd entry's home when HOME is unset). When that place cannot be created
// (no home, a read-only home), /tmp/pushpull-<uid>/secret is used instead,
// with one warning; it is per host, so jobs across hosts then need
// PUSHPULL_JOB_SECRET.
//
// Safety: files are opened O_NOFOLLOW; a secret file that is not a regular
// file, is owned by another uid or is readable or writable by group or
// others is refused (the error names the path and the fix), never "fixed"
// or replaced. The directory must be owned by this uid and not writable by
// group or others. Creation is atomic: the secret is written to an O_EXCL
// temporary file in the same directory, then hard-linked (or renamed without
// replacing) to its name, so processes racing to create it all end up
// reading the one that won.
//
// Thread safety: free functions, safe from any thread and process at once.
#pragma once

#include <string>

#include "pushpull/options.h"

namespace pushpull::base {

// The secret and where it came from.
struct UserSecret {
  std::string secret;
  std::string path;
  bool created = false;   // this call created the file
  bool fallback = false;  // the /tmp fallback was used (no usable home)
};

// The configured or default path (not checked, nothing created).
std::string user_secret_path(const Environment& env);
// /tmp/pushpull-<uid>/secret.
std::string fallback_secret_path();

// Reads a secret file that must exist (PUSHPULL_JOB_SECRET_FILE, or the
// per-user file). Throws IoError (missing, unreadable, empty) or
// InvalidArgument (not private to this user), naming the path.
std::string read_secret_file(const std::string& path);

// Reads `path`, creating it (and its directory) first when it is missing.
UserSecret load_or_create_secret(const std::string& path);

// The per-user secret for `env`: user_secret_path(), or the /tmp fallback
// when that place cannot be created and PUSHPULL_SECRET_FILE is not set.
UserSecret user_secret(const Environment& env);

}  // namespace pushpull::base
