// System-call failures as Status: one place that knows which errno values are a process limit
// (and so have one fix an operator can apply) and which are the caller's own trouble.
#pragma once

#include <string>
#include <system_error>

#include "strait/status.h"

namespace strait {

// EMFILE or ENFILE: out of descriptors, the process's or the system's.
bool IsDescriptorLimit(int err);
bool IsDescriptorLimit(const std::error_code& ec);

// `what` failed with `err`: "what: <strerror>". A descriptor limit (EMFILE, ENFILE) is
// kResourceExhausted and says how to raise it, since every socket, event loop and file needs a
// descriptor and the fix is the same whichever ran out first; anything else has `otherwise` and
// ends with the caller's `fix` (e.g. "; fix: make the directory writable"), if any.
Status ErrnoStatus(const std::string& what, int err,
                   StatusCode otherwise = StatusCode::kUnavailable, const std::string& fix = "");

// The same for an error code from Asio or the standard library (system category: errno values).
Status ErrorCodeStatus(const std::string& what, const std::error_code& ec,
                       StatusCode otherwise = StatusCode::kUnavailable,
                       const std::string& fix = "");

// The same for an exception the standard library or Asio threw ("epoll: Too many open files").
Status SystemErrorStatus(const std::string& what, const std::system_error& e,
                         StatusCode otherwise = StatusCode::kUnavailable,
                         const std::string& fix = "");

}  // namespace strait
