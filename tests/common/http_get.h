// Test helper: one HTTP/1.1 GET over a connected socket with every wait bounded, for the tests
// that probe straitd's /metrics, /healthz and /readyz (each dials the port its own way).
// Header-only, POSIX and the C++ library only.
#ifndef STRAIT_TESTS_COMMON_HTTP_GET_H_
#define STRAIT_TESTS_COMMON_HTTP_GET_H_

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

namespace strait::test {

struct HttpResult {
  int status = 0;  // 0: no answer
  std::string body;
};

// Sends GET `path` on `fd`, reads until the server closes or `seconds` pass, closes `fd`. A
// negative fd (a refused dial) gives status 0.
inline HttpResult HttpGetOn(int fd, const std::string& path, double seconds) {
  HttpResult result;
  if (fd < 0) return result;
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: test\r\n\r\n";
  (void)!::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[8192];
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (out.rfind("HTTP/1.1 ", 0) != 0) return result;
  result.status = std::atoi(out.c_str() + 9);
  const size_t body = out.find("\r\n\r\n");
  if (body != std::string::npos) result.body = out.substr(body + 4);
  return result;
}

}  // namespace strait::test

#endif  // STRAIT_TESTS_COMMON_HTTP_GET_H_
