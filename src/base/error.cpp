// SPDX-License-Identifier: Apache-2.0
#include "pushpull/error.h"

#include <exception>

namespace pushpull {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "OK";
    case ErrorCode::kInvalidArgument:
      return "InvalidArgument";
    case ErrorCode::kNotFound:
      return "NotFound";
    case ErrorCode::kAlreadyExists:
      return "AlreadyExists";
    case ErrorCode::kTimeout:
      return "Timeout";
    case ErrorCode::kPeerFailure:
      return "PeerFailure";
    case ErrorCode::kProtocolError:
      return "ProtocolError";
    case ErrorCode::kIoError:
      return "IoError";
    case ErrorCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

void throw_error(ErrorCode code, const std::string& message) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      throw InvalidArgument(message);
    case ErrorCode::kNotFound:
      throw NotFound(message);
    case ErrorCode::kAlreadyExists:
      throw AlreadyExists(message);
    case ErrorCode::kTimeout:
      throw Timeout(message);
    case ErrorCode::kPeerFailure:
      throw PeerFailure(message);
    case ErrorCode::kProtocolError:
      throw ProtocolError(message);
    case ErrorCode::kIoError:
      throw IoError(message);
    case ErrorCode::kOk:
    case ErrorCode::kInternal:
      break;
  }
  throw Internal(message);
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return std::string(error_code_name(code_)) + ": " + message_;
}

Status Status::from_current_exception() {
  try {
    throw;
  } catch (const Error& e) {
    return Status(e.code(), e.what());
  } catch (const std::exception& e) {
    return Status(ErrorCode::kInternal, e.what());
  } catch (...) {
    return Status(ErrorCode::kInternal, "unknown exception");
  }
}

}  // namespace pushpull
