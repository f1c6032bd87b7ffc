// Tests of the operational HTTP server over real loopback sockets: 200 with the handler's body,
// 404, 405, 400, HEAD, an oversized request head (431), and a slow client cut off at the read
// deadline (408) without blocking the next client for longer than that.
#include "gateway/http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace strait::gateway {
namespace {

int Dial(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads until the server closes (every response closes), at most `seconds`.
std::string ReadAll(int fd, double seconds = 10) {
  std::string out;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  char buf[4096];
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string Request(uint16_t port, const std::string& request) {
  const int fd = Dial(port);
  if (fd < 0) return "connect failed";
  (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out = ReadAll(fd);
  ::close(fd);
  return out;
}

class Http : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions options;
    options.max_request_bytes = 1024;
    options.read_timeout_ns = 500'000'000;
    auto s = HttpServer::Start(
        "127.0.0.1", 0,
        [](const std::string& path) -> std::optional<HttpResponse> {
          if (path == "/metrics") return HttpResponse{200, "m 1\n"};
          if (path == "/readyz") return HttpResponse{503, "no link\n"};
          return std::nullopt;
        },
        options);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(s).value();
  }
  std::unique_ptr<HttpServer> server_;
};

TEST_F(Http, ServesTheHandlersResponse) {
  const std::string r = Request(server_->port(), "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(r,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: 4\r\nConnection: close\r\n\r\nm 1\n");
  EXPECT_EQ(Request(server_->port(), "GET /readyz HTTP/1.0\r\n\r\n").substr(0, 33),
            "HTTP/1.1 503 Service Unavailable\r");
  const std::string head = Request(server_->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(head.find("Content-Length: 4\r\n") != std::string::npos, true) << head;
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n");  // no body
  EXPECT_EQ(server_->bad_requests(), 0u);
}

TEST_F(Http, UnknownPathIs404AndOtherMethods405AndGarbage400) {
  EXPECT_EQ(Request(server_->port(), "GET /nope HTTP/1.1\r\n\r\n").substr(0, 22),
            "HTTP/1.1 404 Not Found");
  EXPECT_EQ(Request(server_->port(), "POST /metrics HTTP/1.1\r\n\r\n").substr(0, 12),
            "HTTP/1.1 405");
  EXPECT_EQ(Request(server_->port(), "hello there\r\n\r\n").substr(0, 12), "HTTP/1.1 400");
  EXPECT_EQ(server_->bad_requests(), 2u);
}

TEST_F(Http, OversizedRequestHeadIs431) {
  const std::string big = "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(4000, 'a') + "\r\n\r\n";
  EXPECT_EQ(Request(server_->port(), big).substr(0, 12), "HTTP/1.1 431");
  // A head that is complete but over the limit in one read is refused too.
  const std::string just_over =
      "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(1000, 'b') + "\r\n\r\n";
  EXPECT_EQ(Request(server_->port(), just_over).substr(0, 12), "HTTP/1.1 431");
  EXPECT_EQ(server_->bad_requests(), 2u);
}

TEST_F(Http, SlowClientIsCutOffAtTheReadDeadline) {
  // Sends half a request and then nothing: the server answers 408 once its 0.5 s pass.
  const int slow = Dial(server_->port());
  ASSERT_GE(slow, 0);
  const std::string part = "GET /metr";
  ASSERT_EQ(::send(slow, part.data(), part.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(part.size()));
  EXPECT_EQ(ReadAll(slow).substr(0, 12), "HTTP/1.1 408");
  ::close(slow);
  // The server is free again.
  EXPECT_EQ(Request(server_->port(), "GET /metrics HTTP/1.1\r\n\r\n").substr(0, 15),
            "HTTP/1.1 200 OK");
  EXPECT_EQ(server_->bad_requests(), 1u);
}

TEST(HttpStart, BadAddressAndTakenPortAreClearErrors) {
  auto bad = HttpServer::Start("localhost-ish", 0,
                               [](const std::string&) { return std::optional<HttpResponse>(); });
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not a numeric IP"), std::string::npos);
  auto first = HttpServer::Start("127.0.0.1", 0,
                                 [](const std::string&) { return std::optional<HttpResponse>(); });
  ASSERT_TRUE(first.ok());
  auto second = HttpServer::Start("127.0.0.1", (*first)->port(),
                                  [](const std::string&) { return std::optional<HttpResponse>(); });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("metrics.listen"), std::string::npos);
}

}  // namespace
}  // namespace strait::gateway
