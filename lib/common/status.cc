// Status implementation: code names, formatting and the error constructors.
#include "strait/status.h"

namespace strait {

const char* StatusCodeName(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kUnknown: return "UNKNOWN";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
  }
  return "UNKNOWN_CODE";
}

Status::Status(StatusCode code, std::string message) : code_(code) {
  if (code_ != StatusCode::kOk) message_ = std::move(message);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out = StatusCodeName(code_);
  out += ": ";
  out += message_;
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Status(code_, std::move(msg));
}

std::ostream& operator<<(std::ostream& os, const Status& status) { return os << status.ToString(); }

#define STRAIT_DEFINE_ERROR_(Name, Code) \
  Status Name(std::string message) { return Status(StatusCode::Code, std::move(message)); }
STRAIT_DEFINE_ERROR_(CancelledError, kCancelled)
STRAIT_DEFINE_ERROR_(UnknownError, kUnknown)
STRAIT_DEFINE_ERROR_(InvalidArgumentError, kInvalidArgument)
STRAIT_DEFINE_ERROR_(DeadlineExceededError, kDeadlineExceeded)
STRAIT_DEFINE_ERROR_(NotFoundError, kNotFound)
STRAIT_DEFINE_ERROR_(AlreadyExistsError, kAlreadyExists)
STRAIT_DEFINE_ERROR_(PermissionDeniedError, kPermissionDenied)
STRAIT_DEFINE_ERROR_(ResourceExhaustedError, kResourceExhausted)
STRAIT_DEFINE_ERROR_(FailedPreconditionError, kFailedPrecondition)
STRAIT_DEFINE_ERROR_(AbortedError, kAborted)
STRAIT_DEFINE_ERROR_(OutOfRangeError, kOutOfRange)
STRAIT_DEFINE_ERROR_(UnimplementedError, kUnimplemented)
STRAIT_DEFINE_ERROR_(InternalError, kInternal)
STRAIT_DEFINE_ERROR_(UnavailableError, kUnavailable)
STRAIT_DEFINE_ERROR_(DataLossError, kDataLoss)
#undef STRAIT_DEFINE_ERROR_

}  // namespace strait
