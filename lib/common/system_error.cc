// ErrnoStatus and friends: errno values to Status, with the operator's fix for descriptor limits.
#include "common/system_error.h"

#include <cerrno>
#include <cstring>

namespace strait {
namespace {

// The errno behind `ec`, or 0. Debian's Asio has its own system category ("asio.system", not
// std::system_category) and, built without ASIO_HAS_STD_ERROR_CODE, maps none of its values to
// the generic category: it is recognised by name, which keeps common free of Asio. Other
// categories (Asio's addrinfo and misc, futures) carry no errno.
int Errno(const std::error_code& ec) {
  const std::error_category& category = ec.category();
  const bool system = category == std::system_category() ||
                      category == std::generic_category() ||
                      std::strcmp(category.name(), "asio.system") == 0;
  return system ? ec.value() : 0;
}

Status Make(const std::string& what, int err, const std::string& text, StatusCode otherwise,
            const std::string& fix) {
  if (!IsDescriptorLimit(err)) return Status(otherwise, what + ": " + text + fix);
  // ENFILE is the whole system's table, EMFILE this process's limit.
  return ResourceExhaustedError(
      what + ": " + text +
      (err == EMFILE ? "; raise the process's open-file limit (ulimit -n, systemd LimitNOFILE=, "
                       "the container's nofile ulimit) to at least 1024"
                     : "; the system's file table is full (fs.file-max): close other programs' "
                       "descriptors or raise fs.file-max"));
}

}  // namespace

bool IsDescriptorLimit(int err) { return err == EMFILE || err == ENFILE; }

bool IsDescriptorLimit(const std::error_code& ec) { return IsDescriptorLimit(Errno(ec)); }

Status ErrnoStatus(const std::string& what, int err, StatusCode otherwise,
                   const std::string& fix) {
  return Make(what, err, std::strerror(err), otherwise, fix);
}

Status ErrorCodeStatus(const std::string& what, const std::error_code& ec, StatusCode otherwise,
                       const std::string& fix) {
  return Make(what, Errno(ec), ec.message(), otherwise, fix);
}

Status SystemErrorStatus(const std::string& what, const std::system_error& e,
                         StatusCode otherwise, const std::string& fix) {
  return Make(what, Errno(e.code()), e.what(), otherwise, fix);
}

}  // namespace strait
