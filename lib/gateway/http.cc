// The operational HTTP server (see http.h): plain blocking sockets polled in slices.
#include "gateway/http.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/clock.h"
#include "common/log.h"

namespace strait::gateway {
namespace {

constexpr int kPollSliceMs = 100;
constexpr const char* kLog = "http";

// Writes everything or gives up at the deadline (a client that stops reading).
void WriteAllBounded(int fd, const std::string& data, Deadline deadline) {
  size_t done = 0;
  while (done < data.size() && !deadline.Expired()) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, kPollSliceMs) <= 0) continue;
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string Render(const HttpResponse& r, bool head_only) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + HttpReason(r.status) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  out += "Connection: close\r\n\r\n";
  if (!head_only) out += r.body;
  return out;
}

}  // namespace

const char* HttpReason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
  }
  return "Unknown";
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address, uint16_t port,
                                                        HttpHandler handler,
                                                        HttpServerOptions options) {
  const std::string where = address + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* info = nullptr;
  if (::getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &info) != 0 ||
      info == nullptr) {
    return InvalidArgumentError("HTTP listen address '" + address + "' is not a numeric IP");
  }
  const int fd = ::socket(info->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  bool ok = fd >= 0 && ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
            ::bind(fd, info->ai_addr, info->ai_addrlen) == 0 && ::listen(fd, 16) == 0;
  const int err = errno;
  ::freeaddrinfo(info);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (ok) ok = ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0;
  if (!ok) {
    if (fd >= 0) ::close(fd);
    return UnavailableError("cannot listen for HTTP on " + where + ": " + std::strerror(err) +
                            " (is the port taken? change metrics.listen)");
  }
  const uint16_t actual = bound.ss_family == AF_INET6
                              ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                              : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<HttpServer>(new HttpServer(fd, actual, std::move(handler), options));
}

HttpServer::HttpServer(int fd, uint16_t port, HttpHandler handler, HttpServerOptions options)
    : listen_fd_(fd), port_(port), handler_(std::move(handler)), options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

HttpServer::~HttpServer() {
  stopping_.store(true);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
}

void HttpServer::Loop() {
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, kPollSliceMs) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Serve(fd);
    ::close(fd);
  }
}

void HttpServer::Serve(int fd) {
  const Deadline read_deadline = Deadline::After(options_.read_timeout_ns);
  std::string head;
  char buf[1024];
  auto reply = [&](const HttpResponse& r, bool head_only) {
    WriteAllBounded(fd, Render(r, head_only), Deadline::After(options_.write_timeout_ns));
  };
  auto refuse = [&](int status, const std::string& why) {
    ++bad_requests_;
    STRAIT_LOG(kDebug, kLog) << "HTTP " << status << ": " << why;
    reply(HttpResponse{status, why + "\n"}, false);
  };
  size_t end = std::string::npos;
  while ((end = head.find("\r\n\r\n")) == std::string::npos) {
    if (head.size() > options_.max_request_bytes) {
      return refuse(431,
                    "request head over " + std::to_string(options_.max_request_bytes) + " bytes");
    }
    if (read_deadline.Expired()) return refuse(408, "request head not complete in time");
    if (stopping_.load()) return;
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, kPollSliceMs);
    if (rc <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;  // the client went away
    head.append(buf, static_cast<size_t>(n));
  }
  if (end + 4 > options_.max_request_bytes) {
    return refuse(431,
                  "request head over " + std::to_string(options_.max_request_bytes) + " bytes");
  }
  // Request line: METHOD SP target SP HTTP/1.x
  const std::string line = head.substr(0, head.find("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.compare(sp2 + 1, 7, "HTTP/1.") != 0 || sp2 == sp1 + 1) {
    return refuse(400, "malformed request line");
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
  if (method != "GET" && method != "HEAD") return refuse(405, "only GET and HEAD are served");
  std::optional<HttpResponse> response = handler_(path);
  if (!response) response = HttpResponse{404, "no such endpoint: " + path + "\n"};
  reply(*response, method == "HEAD");
}

}  // namespace strait::gateway
