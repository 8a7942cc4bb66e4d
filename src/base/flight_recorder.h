// SPDX-License-Identifier: Apache-2.0
// The flight recorder (docs/timeline.md, "Flight recorder"): each process
// keeps its last N collective and parameter-server operations (kind, name,
// bytes, state queued/started/done/failed, timestamps) in a ring, and writes
// them as JSON when something goes wrong: a stall warning, a failure, a
// timeout, or SIGUSR1 from whoever wants to look at a live process.
//
// N is PUSHPULL_FLIGHT_RECORDER_SIZE (default 1024; 0 turns it off). A dump
// goes to PUSHPULL_FLIGHT_RECORDER_DIR (default: the working directory) as
// pushpull-flight.<role><rank>.json (pushpull-flight.pid<N>.json when the
// environment names no role or rank), replaced by each later dump, written
// through base/private_file.h (never through a symlink, 0600).
//
// Cost: record() is a relaxed fetch_add for the slot, a per-slot spin lock
// (contended only when the ring wraps onto a slot being written) and a copy
// of the name into the slot (at most kNameBytes); no allocation. update() is
// the same lock and two stores, and drops the update when the slot was
// reused meanwhile.
//
// SIGUSR1: installed only when the signal's disposition is the default (a
// program's own handler is left alone). The handler writes one byte to a
// pipe; a background thread (polling with a 1 s tick) writes the dump, so
// nothing unsafe runs in the handler.
//
// Thread safety: every function may be called from any thread. Ownership:
// the ring and the SIGUSR1 thread are process-wide and live until exit.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace pushpull::flight {

enum class State : uint8_t { kQueued, kStarted, kDone, kFailed };
std::string_view state_name(State s);

inline constexpr size_t kNameBytes = 96;  // longer names are cut

// Starts the recorder from the environment (ObserveOptions) if not yet
// decided: the ring and the SIGUSR1 dumper. Called where a node or a
// collective session starts; record() also calls it.
void start_from_env() noexcept;
// For tests: starts (or restarts, emptied) with `size` slots writing to `dir`
// as `tag` ("worker0"); size 0 turns it off.
void start(int size, std::string dir, std::string tag);

// A new operation: `kind` a string literal ("allreduce", "push", ...),
// `name` the tensor or key. Returns its id for update() (0: not recorded).
uint64_t record(std::string_view kind, std::string_view name, int64_t bytes, State state) noexcept;
// Moves operation `id` to `state`, stamping the time of it.
void update(uint64_t id, State state) noexcept;

// The ring as JSON: {"process":..., "pid":..., "reason":..., "dumped_unix_ms":...,
// "operations":[{"seq", "kind", "name", "bytes", "state", "queued_unix_ms",
// "started_unix_ms", "ended_unix_ms", "age_ms"}, ...]} oldest first.
std::string to_json(std::string_view reason);
// Writes the dump file now (from the calling thread); returns its path, ""
// when off or when writing failed (logged). Dumps for the same reason class
// come at most once a second (a failure cascade writes one file, not many).
std::string dump(std::string_view reason) noexcept;
// The file dump() writes ("" when off).
std::string dump_path();

}  // namespace pushpull::flight
