// The operational HTTP server (see http.h) on one Asio event loop: an acceptor and one small
// state machine per connection (read the head under a deadline, answer under a deadline, close).
#include "gateway/http.h"

#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <list>
#include <thread>
#include <utility>

#include <asio.hpp>

#include "common/log.h"
#include "common/system_error.h"
#include "net/accept_pause.h"

namespace strait::gateway {
namespace {

constexpr const char* kLog = "http";

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

class Connection;

class HttpServer::Core {
 public:
  Core(HttpHandler handler, HttpServerOptions options)
      : acceptor_(io_),
        accept_pause_(io_.get_executor(), "an HTTP connection", kLog),
        handler_(std::move(handler)),
        options_(options) {}

  Status Bind(const std::string& address, uint16_t port, uint16_t* bound);
  void Run() {
    Accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  // Closes the acceptor and every connection on the loop, then waits for the loop to drain.
  void Stop();

  void Forget(std::list<std::shared_ptr<Connection>>::iterator it) {
    connections_.erase(it);
    open_.store(connections_.size());
  }
  void CountBadRequest() { bad_requests_.fetch_add(1); }
  const HttpHandler& handler() const { return handler_; }
  const HttpServerOptions& options() const { return options_; }
  asio::io_context& io() { return io_; }
  uint64_t bad_requests() const { return bad_requests_.load(); }
  size_t open_connections() const { return open_.load(); }

 private:
  void Accept();

  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
  // Out of descriptors or memory: accepting pauses instead of spinning (see net/accept_pause.h).
  net::AcceptPause accept_pause_;
  HttpHandler handler_;
  HttpServerOptions options_;
  // Oldest first; touched on the loop's thread only.
  std::list<std::shared_ptr<Connection>> connections_;
  std::atomic<size_t> open_{0};
  std::atomic<uint64_t> bad_requests_{0};
  std::thread thread_;
};

// One client: its request head under read_timeout, then its response under write_timeout.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpServer::Core& core, asio::ip::tcp::socket socket)
      : core_(core), socket_(std::move(socket)), timer_(core.io()) {}

  void Start(std::list<std::shared_ptr<Connection>>::iterator self) {
    self_ = self;
    Arm(core_.options().read_timeout_ns, [](Connection& c) {
      c.Refuse(408, "request head not complete in time");
    });
    Read();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    asio::error_code ignored;
    socket_.close(ignored);
    timer_.cancel();
    core_.Forget(self_);  // may drop the last owner but the running handler's
  }

 private:
  template <typename OnExpiry>
  void Arm(int64_t nanos, OnExpiry on_expiry) {
    timer_.expires_after(std::chrono::nanoseconds(nanos));
    timer_.async_wait([self = shared_from_this(), on_expiry](const asio::error_code& ec) {
      if (!ec && !self->closed_) on_expiry(*self);
    });
  }

  void Read() {
    socket_.async_read_some(asio::buffer(buf_),
                            [self = shared_from_this()](const asio::error_code& ec, size_t n) {
                              self->OnRead(ec, n);
                            });
  }

  void OnRead(const asio::error_code& ec, size_t n) {
    if (closed_ || replying_) return;
    if (ec) return Close();  // the client went away
    head_.append(buf_.data(), n);
    const size_t limit = core_.options().max_request_bytes;
    const size_t end = head_.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (head_.size() > limit) {
        return Refuse(431, "request head over " + std::to_string(limit) + " bytes");
      }
      return Read();
    }
    if (end + 4 > limit) {
      return Refuse(431, "request head over " + std::to_string(limit) + " bytes");
    }
    Answer();
  }

  void Answer() {
    // Request line: METHOD SP target SP HTTP/1.x
    const std::string line = head_.substr(0, head_.find("\r\n"));
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string::npos || line.compare(sp2 + 1, 7, "HTTP/1.") != 0 ||
        sp2 == sp1 + 1) {
      return Refuse(400, "malformed request line");
    }
    const std::string method = line.substr(0, sp1);
    std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
    if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
    if (method != "GET" && method != "HEAD") return Refuse(405, "only GET and HEAD are served");
    std::optional<HttpResponse> response;
    try {
      response = core_.handler()(path);
    } catch (const std::exception& e) {
      STRAIT_LOG(kWarn, kLog) << "handler for " << path << " failed: " << e.what();
      response = HttpResponse{500, "internal error\n"};
    }
    if (!response) response = HttpResponse{404, "no such endpoint: " + path + "\n"};
    Reply(*response, method == "HEAD");
  }

  void Refuse(int status, const std::string& why) {
    core_.CountBadRequest();
    STRAIT_LOG(kDebug, kLog) << "HTTP " << status << ": " << why;
    Reply(HttpResponse{status, why + "\n"}, false);
  }

  void Reply(const HttpResponse& response, bool head_only) {
    replying_ = true;
    out_ = Render(response, head_only);
    // A client that stops reading is cut off; the read still pending (408) ends aborted.
    Arm(core_.options().write_timeout_ns, [](Connection& c) { c.Close(); });
    asio::async_write(socket_, asio::buffer(out_),
                      [self = shared_from_this()](const asio::error_code&, size_t) {
                        self->Close();
                      });
  }

  HttpServer::Core& core_;
  asio::ip::tcp::socket socket_;
  asio::steady_timer timer_;
  std::list<std::shared_ptr<Connection>>::iterator self_;
  std::array<char, 1024> buf_{};
  std::string head_;
  std::string out_;
  bool replying_ = false;
  bool closed_ = false;
};

Status HttpServer::Core::Bind(const std::string& address, uint16_t port, uint16_t* bound) {
  const std::string where = address + ":" + std::to_string(port);
  asio::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(address, ec);
  if (ec) return InvalidArgumentError("HTTP listen address '" + address + "' is not a numeric IP");
  const asio::ip::tcp::endpoint endpoint(ip, port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) *bound = acceptor_.local_endpoint(ec).port();
  if (ec) {
    return ErrorCodeStatus("cannot listen for HTTP on " + where, ec, StatusCode::kUnavailable,
                           " (is the port taken? change metrics.listen)");
  }
  return Status::Ok();
}

void HttpServer::Core::Accept() {
  acceptor_.async_accept([this](const asio::error_code& ec, asio::ip::tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;  // Stop()
    if (ec) return accept_pause_.OnFailure(ec, [this] { Accept(); });
    accept_pause_.OnSuccess();
    if (connections_.size() >= options_.max_connections && !connections_.empty()) {
      // Whoever holds a connection longest yields: a flood of idle clients cannot lock a
      // probe out, it only shortens how long each of them may idle.
      connections_.front()->Close();
    }
    auto connection = std::make_shared<Connection>(*this, std::move(socket));
    connections_.push_back(connection);
    open_.store(connections_.size());
    connection->Start(std::prev(connections_.end()));
    Accept();
  });
}

void HttpServer::Core::Stop() {
  asio::post(io_, [this] {
    asio::error_code ignored;
    acceptor_.close(ignored);
    accept_pause_.Cancel();
    // Close() unlinks each connection; iterate over a copy.
    std::list<std::shared_ptr<Connection>> open = connections_;
    for (auto& c : open) c->Close();
  });
  if (thread_.joinable()) thread_.join();  // run() returns once nothing is left pending
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address, uint16_t port,
                                                        HttpHandler handler,
                                                        HttpServerOptions options) {
  auto core = std::make_unique<Core>(std::move(handler), options);
  uint16_t bound = 0;
  STRAIT_RETURN_IF_ERROR(core->Bind(address, port, &bound));
  core->Run();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(core), bound));
}

HttpServer::HttpServer(std::unique_ptr<Core> core, uint16_t port)
    : core_(std::move(core)), port_(port) {}

HttpServer::~HttpServer() { core_->Stop(); }

uint64_t HttpServer::bad_requests() const { return core_->bad_requests(); }
size_t HttpServer::open_connections() const { return core_->open_connections(); }

}  // namespace strait::gateway
