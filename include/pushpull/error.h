// SPDX-License-Identifier: Apache-2.0
// Errors of the public API.
//
// Every failure that reaches a user is one of the exception types below. The
// message says what failed, where (key, node, address) and what to do about
// it. Inside event loops failures travel as `Status` values instead and are
// turned into exceptions at the API boundary by `Status::raise()`.
//
// Thread safety: all types here are values; safe to copy between threads.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace pushpull {

enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument,  // the caller passed something wrong; nothing was changed
  kNotFound,         // a key, file or peer that does not exist
  kAlreadyExists,    // e.g. a key initialised twice
  kTimeout,          // a deadline passed
  kPeerFailure,      // another node died or was declared dead
  kProtocolError,    // malformed or incompatible input from the network
  kIoError,          // the operating system refused (socket, file)
  kInternal,         // a bug in pushpull
};

// Name of a code, e.g. "InvalidArgument".
std::string_view error_code_name(ErrorCode code);

// Base of every exception pushpull throws.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

#define PUSHPULL_DEFINE_ERROR(Name)                                                   \
  class Name : public Error {                                                         \
   public:                                                                            \
    explicit Name(const std::string& message) : Error(ErrorCode::k##Name, message) {} \
  };
PUSHPULL_DEFINE_ERROR(InvalidArgument)
PUSHPULL_DEFINE_ERROR(NotFound)
PUSHPULL_DEFINE_ERROR(AlreadyExists)
PUSHPULL_DEFINE_ERROR(Timeout)
PUSHPULL_DEFINE_ERROR(PeerFailure)
PUSHPULL_DEFINE_ERROR(ProtocolError)
PUSHPULL_DEFINE_ERROR(IoError)
PUSHPULL_DEFINE_ERROR(Internal)
#undef PUSHPULL_DEFINE_ERROR

// Throws the exception type that matches `code`. `code` must not be kOk.
[[noreturn]] void throw_error(ErrorCode code, const std::string& message);

// A success-or-error value for code paths that must not throw (event loops,
// destructors). Cheap to copy when ok.
class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }

  bool is_ok() const noexcept { return code_ == ErrorCode::kOk; }
  explicit operator bool() const noexcept { return is_ok(); }
  ErrorCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // "InvalidArgument: message", or "OK".
  std::string to_string() const;
  // Throws the matching exception if not ok.
  void raise() const {
    if (!is_ok()) throw_error(code_, message_);
  }
  // Captures the exception currently being handled (call inside a catch block).
  static Status from_current_exception();

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

}  // namespace pushpull
