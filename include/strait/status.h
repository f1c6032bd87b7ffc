// Status and StatusOr<T>: how every Strait function reports an expected failure.
//
// A Status is a code from a fixed set plus a message written for the person who will read it:
// it says what went wrong and what to do. Codes follow the gRPC/Abseil canon so that callers can
// branch on them (kDeadlineExceeded: retry later; kInvalidArgument: fix the input). Exceptions are
// kept for programmer errors and out-of-memory; they never cross a C boundary.
//
// Both types are [[nodiscard]]: ignoring a returned error is a build failure under
// -Werror=unused-result, which the project's warnings turn on.
#ifndef STRAIT_STATUS_H_
#define STRAIT_STATUS_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace strait {

// Values are explicit and never renumbered: they travel in the local protocol and in logs.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
};

// The canonical name of a code, e.g. "INVALID_ARGUMENT". Never null.
const char* StatusCodeName(StatusCode code) noexcept;

class [[nodiscard]] Status {
 public:
  // An OK status.
  Status() noexcept = default;
  // A status with `code` and `message`. An OK code drops the message.
  Status(StatusCode code, std::string message);

  static Status Ok() noexcept { return Status(); }

  bool ok() const noexcept { return code_ == StatusCode::kOk; }
  StatusCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }

  // "OK", or "<CODE>: <message>".
  std::string ToString() const;

  // Returns a status with the same code and `context + ": " + message`, so that a caller can say
  // which operation failed without losing the callee's reason.
  Status WithContext(std::string_view context) const;

  // Explicitly drops a status that the caller has decided not to act on (e.g. during cleanup).
  void IgnoreError() const noexcept {}

  friend bool operator==(const Status& a, const Status& b) noexcept {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& status);

Status CancelledError(std::string message);
Status UnknownError(std::string message);
Status InvalidArgumentError(std::string message);
Status DeadlineExceededError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status PermissionDeniedError(std::string message);
Status ResourceExhaustedError(std::string message);
Status FailedPreconditionError(std::string message);
Status AbortedError(std::string message);
Status OutOfRangeError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
Status UnavailableError(std::string message);
Status DataLossError(std::string message);

// Either a value of type T or a non-OK Status explaining why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  // From an error. Passing an OK status is a programmer error and becomes kInternal.
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "StatusOr built from an OK Status");
  }
  StatusOr(const T& value) : value_(value) {}        // NOLINT(google-explicit-constructor)
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const noexcept { return status_.ok(); }
  const Status& status() const& noexcept { return status_; }
  Status status() && { return std::move(status_); }

  // Accessors require ok(); calling them on an error is a programmer error (it throws
  // std::bad_optional_access rather than reading garbage).
  T& value() & { return value_.value(); }
  const T& value() const& { return value_.value(); }
  T&& value() && { return std::move(value_).value(); }
  T& operator*() & { return value_.value(); }
  const T& operator*() const& { return value_.value(); }
  T&& operator*() && { return std::move(value_).value(); }
  T* operator->() { return &value_.value(); }
  const T* operator->() const { return &value_.value(); }

  template <typename U>
  T value_or(U&& fallback) const& {
    return ok() ? *value_ : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace strait

#define STRAIT_STATUS_CONCAT_INNER_(a, b) a##b
#define STRAIT_STATUS_CONCAT_(a, b) STRAIT_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function with the status of `expr` if it is not OK.
#define STRAIT_RETURN_IF_ERROR(expr)                                     \
  do {                                                                   \
    ::strait::Status strait_status_tmp_ = (expr);                        \
    if (!strait_status_tmp_.ok()) return strait_status_tmp_;             \
  } while (false)

// `STRAIT_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a StatusOr's value, or returns its
// error from the enclosing function.
#define STRAIT_ASSIGN_OR_RETURN(lhs, expr) \
  STRAIT_ASSIGN_OR_RETURN_IMPL_(STRAIT_STATUS_CONCAT_(strait_statusor_, __LINE__), lhs, expr)
#define STRAIT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

#endif  // STRAIT_STATUS_H_
