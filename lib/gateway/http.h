// A minimal HTTP/1.1 server for straitd's operational endpoints (/metrics, /healthz, /readyz):
// GET and HEAD only, every response closes the connection. Meant for Prometheus scrapes and
// probes from kubelet or a load balancer, not for general traffic.
//
// It serves any number of connections at once on one Asio event loop (its own io_context and
// thread until straitd's loops are merged), so that no client -- idle, slow, or hundreds of
// them -- delays a liveness probe: each connection has a deadline for its request head and one
// for its response, request heads are bounded, at most max_connections are open (the oldest is
// dropped for a newcomer), and running out of file descriptors pauses accepting briefly instead
// of spinning.
//
// Usage:
//   auto server = HttpServer::Start("127.0.0.1", 9464, [](const std::string& path) {
//     if (path == "/healthz") return std::optional<HttpResponse>(HttpResponse{200, "ok\n"});
//     return std::optional<HttpResponse>();  // 404
//   });
//   (*server)->port();  // the bound port (useful with port 0)
//
// Answers: the handler's response; 404 for a path it does not know; 405 for other methods; 400
// for a malformed request line; 431 for a request head over max_request_bytes; 408 when the
// head did not arrive within read_timeout; 500 if the handler throws. Threads: the handler runs
// on the server's thread and must be thread-safe with respect to the rest of the program.
// Destruction closes every connection and joins the thread.
#ifndef STRAIT_LIB_GATEWAY_HTTP_H_
#define STRAIT_LIB_GATEWAY_HTTP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "strait/status.h"

namespace strait::gateway {

struct HttpResponse {
  int status = 200;
  std::string body;
  std::string content_type = "text/plain; charset=utf-8";
};

// Called with the request path (query string removed); nullopt means 404.
using HttpHandler = std::function<std::optional<HttpResponse>(const std::string& path)>;

struct HttpServerOptions {
  size_t max_request_bytes = 8192;                     // request line + headers
  int64_t read_timeout_ns = int64_t{5'000'000'000};    // for the whole request head
  int64_t write_timeout_ns = int64_t{10'000'000'000};  // for the whole response
  size_t max_connections = 1024;                        // open at once; the oldest yields
};

class HttpServer {
 public:
  // Binds `address` (numeric IPv4 or IPv6) and `port` (0 = ephemeral) and starts serving.
  // kUnavailable naming the address when it cannot bind.
  static StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address, uint16_t port,
                                                     HttpHandler handler,
                                                     HttpServerOptions options = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const { return port_; }
  // Requests answered with 4xx because of the client (malformed, oversized, too slow, wrong
  // method); 404s are not counted. Thread-safe.
  uint64_t bad_requests() const;
  // Connections open now (accepted and not yet closed). Thread-safe.
  size_t open_connections() const;

  class Core;  // the event loop and the connections (http.cc)

 private:
  HttpServer(std::unique_ptr<Core> core, uint16_t port);

  std::unique_ptr<Core> core_;
  uint16_t port_;
};

// The reason phrase for the status codes the server uses ("OK", "Not Found", ...).
const char* HttpReason(int status);

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_HTTP_H_
