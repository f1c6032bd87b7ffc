// Tests of the operational HTTP server over real loopback sockets: 200 with the handler's body,
// 404, 405, 400, HEAD, an oversized request head (431), a slow client cut off at the read
// deadline (408), hundreds of idle and slow clients that do not delay a probe, and the
// connection cap that drops the oldest client for a newcomer.
#include "gateway/http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

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

// What a liveness probe meets on a busy or attacked metrics port: 500 connections that send
// nothing and 50 that trickle a request head one byte at a time. Each probe is answered at once
// (the old server served one connection at a time: one idle client delayed /healthz by 4.8 s).
TEST_F(Http, ProbesAreAnsweredAtOnceBeside500IdleAnd50SlowClients) {
  // Both ends of 550 connections live in this process: more than a 1024 descriptor limit.
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur < 2048) {
    limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 4096);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  }
  ASSERT_GE(limit.rlim_cur, 1200u) << "the descriptor limit (ulimit -Hn) is too low for this test";
  std::vector<int> idle, slow;
  for (int i = 0; i < 500; ++i) {
    const int fd = Dial(server_->port());
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.push_back(fd);
  }
  for (int i = 0; i < 50; ++i) {
    const int fd = Dial(server_->port());
    ASSERT_GE(fd, 0);
    slow.push_back(fd);
  }
  const std::string head = "GET /metrics HTTP/1.1\r\n\r\n";
  double worst_ms = 0;
  for (int round = 0; round < 10; ++round) {
    for (size_t k = 0; k < slow.size(); ++k) {  // one more byte from every slow client
      (void)!::send(slow[k], head.data() + round, 1, MSG_NOSIGNAL);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const std::string reply = Request(server_->port(), "GET /metrics HTTP/1.1\r\n\r\n");
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(reply.substr(0, 15), "HTTP/1.1 200 OK") << "round " << round;
    worst_ms = std::max(worst_ms, ms);
  }
  // Not a speed benchmark: a bound far above one loopback round trip and far below one read
  // deadline (0.5 s here, 5 s in straitd), which a server that waits on any client would hit.
  EXPECT_LT(worst_ms, 250) << "a probe waited for other clients";
  EXPECT_GE(server_->open_connections(), 550u);
  for (int fd : idle) ::close(fd);
  for (int fd : slow) ::close(fd);
}

TEST(HttpCap, TheOldestConnectionYieldsToANewcomerAtTheCap) {
  HttpServerOptions options;
  options.max_connections = 4;
  auto s = HttpServer::Start(
      "127.0.0.1", 0,
      [](const std::string&) { return std::optional<HttpResponse>(HttpResponse{200, "ok\n"}); },
      options);
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(Dial((*s)->port()));
  // The fifth client is served; the first one held was closed to make room.
  EXPECT_EQ(Request((*s)->port(), "GET /x HTTP/1.1\r\n\r\n").substr(0, 15), "HTTP/1.1 200 OK");
  EXPECT_EQ(ReadAll(held[0], 2), "");  // closed without an answer (recv returns 0)
  char c;
  EXPECT_EQ(::recv(held[0], &c, 1, MSG_DONTWAIT), 0);
  EXPECT_LE((*s)->open_connections(), 4u);
  for (int fd : held) ::close(fd);
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
