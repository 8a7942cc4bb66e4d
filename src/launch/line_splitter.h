// SPDX-License-Identifier: Apache-2.0
// Splits a byte stream into whole lines, so output read from a child's pipe
// in arbitrary chunks is printed one complete line at a time (never a
// fragment of one process's line glued to another's).
//
// A line longer than `max_line` is emitted in pieces of `max_line` bytes so a
// process that never prints a newline cannot grow the buffer without bound.
// Thread safety: none (one per pipe, used by the supervisor's loop).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pushpull::launch {

class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line = 64 << 10) : max_line_(max_line) {}

  // Calls `emit(line)` (without the '\n') for every line completed by `data`.
  template <typename Emit>
  void feed(std::string_view data, Emit&& emit) {
    while (!data.empty()) {
      auto nl = data.find('\n');
      if (nl == std::string_view::npos) {
        partial_.append(data);
        while (partial_.size() >= max_line_) {
          emit(std::string_view(partial_).substr(0, max_line_));
          partial_.erase(0, max_line_);
        }
        return;
      }
      if (partial_.empty()) {
        emit(data.substr(0, nl));
      } else {
        partial_.append(data.substr(0, nl));
        emit(std::string_view(partial_));
        partial_.clear();
      }
      data.remove_prefix(nl + 1);
    }
  }

  // Emits what is left of an unfinished last line (at end of stream).
  template <typename Emit>
  void flush(Emit&& emit) {
    if (!partial_.empty()) emit(std::string_view(partial_));
    partial_.clear();
  }

 private:
  size_t max_line_;
  std::string partial_;
};

}  // namespace pushpull::launch
