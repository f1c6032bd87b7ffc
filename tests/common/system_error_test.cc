// Tests for the errno-to-Status helpers: a descriptor limit carries its fix, nothing else does.
#include "common/system_error.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <future>
#include <system_error>
#include <vector>

namespace strait {
namespace {

TEST(SystemError, OutOfDescriptorsIsResourceExhaustedWithTheFix) {
  const Status s = ErrnoStatus("cannot listen on 127.0.0.1:1", EMFILE);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("cannot listen on 127.0.0.1:1: Too many open files"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("raise the process's open-file limit (ulimit -n"), std::string::npos)
      << s;
  const Status table = ErrnoStatus("socket()", ENFILE);
  EXPECT_EQ(table.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(table.message().find("fs.file-max"), std::string::npos) << table;
}

TEST(SystemError, OtherErrorsKeepTheCallersCodeAndNoHint) {
  const Status s = ErrnoStatus("cannot bind", EADDRINUSE);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "cannot bind: Address already in use");
  EXPECT_EQ(ErrnoStatus("x", EACCES, StatusCode::kPermissionDenied).code(),
            StatusCode::kPermissionDenied);
  EXPECT_FALSE(IsDescriptorLimit(EAGAIN));
}

// The caller's own fix is for its own errors; out of descriptors, only the limit's fix is given.
TEST(SystemError, TheCallersFixIsAddedUnlessDescriptorsRanOut) {
  EXPECT_EQ(ErrnoStatus("lock", EACCES, StatusCode::kUnavailable, "; fix: chmod").message(),
            "lock: Permission denied; fix: chmod");
  const Status limit = ErrnoStatus("lock", EMFILE, StatusCode::kUnavailable, "; fix: chmod");
  EXPECT_EQ(limit.message().find("chmod"), std::string::npos) << limit;
  EXPECT_NE(limit.message().find("open-file limit"), std::string::npos) << limit;
}

TEST(SystemError, ErrorCodesAndExceptionsOfTheSystemCategory) {
  const std::error_code emfile(EMFILE, std::system_category());
  EXPECT_TRUE(IsDescriptorLimit(emfile));
  EXPECT_EQ(ErrorCodeStatus("accept", emfile).code(), StatusCode::kResourceExhausted);
  const std::system_error thrown(emfile, "epoll");
  const Status s = SystemErrorStatus("cannot start", thrown, StatusCode::kInternal);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("cannot start: epoll: Too many open files; raise"),
            std::string::npos)
      << s;
  // Asio's system category is its own object, named "asio.system".
  class AsioLike : public std::error_category {
   public:
    const char* name() const noexcept override { return "asio.system"; }
    std::string message(int value) const override { return std::strerror(value); }
  };
  static const AsioLike asio_like;
  EXPECT_TRUE(IsDescriptorLimit(std::error_code(EMFILE, asio_like)));
  EXPECT_EQ(ErrorCodeStatus("listen", std::error_code(EMFILE, asio_like)).code(),
            StatusCode::kResourceExhausted);
  // A category whose value 24 means something else is not a descriptor limit.
  const std::error_code future = std::make_error_code(std::future_errc::no_state);
  EXPECT_FALSE(IsDescriptorLimit(std::error_code(EMFILE, std::future_category())));
  EXPECT_EQ(ErrorCodeStatus("wait", future).code(), StatusCode::kUnavailable);
}

// The errno a real socket() gives once the limit is reached is the one the helper recognises.
TEST(SystemError, ARealSocketPastTheLimitIsRecognised) {
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit tight = old;
  std::vector<int> fds;
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(probe, 0);
  ::close(probe);
  tight.rlim_cur = static_cast<rlim_t>(probe) + 2;  // room for two more
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  int err = 0;
  for (int i = 0; i < 8; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
      err = errno;
      break;
    }
    fds.push_back(fd);
  }
  for (const int fd : fds) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  ASSERT_NE(err, 0) << "the limit did not stop socket()";
  EXPECT_TRUE(IsDescriptorLimit(err));
  EXPECT_EQ(ErrnoStatus("socket()", err).code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace strait
