// The Comm base's loop-side code: closing sockets, and the gateway control connection (dial,
// hello, length-prefixed control frames) that tunnel comms share; plus the loop and the small
// helpers every comm kind uses (see transport_comm.h).
#include "plugins/nccl/transport_comm.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "common/endian.h"
#include "common/random.h"

namespace strait::nccl {

EventLoop& Loop() {
  static EventLoop* loop = new EventLoop();  // never destroyed: see Transport::Get
  return *loop;
}

std::string Describe(const sockaddr_storage& a) {
  const int port = a.ss_family == AF_INET
                       ? ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port)
                       : ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  const std::string host = AddressToString(a);
  return (a.ss_family == AF_INET6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

uint64_t RandomId() { return RandomNonzero64(); }

std::string UvError(int rc) {
  return std::string(uv_err_name(rc)) + " (" + uv_strerror(rc) + ")";
}

void OnAllocCb(uv_handle_t* h, size_t /*suggested*/, uv_buf_t* buf) {
  auto* s = static_cast<Socket*>(h->data);
  *buf = uv_buf_init(nullptr, 0);
  if (s->Control()) {
    s->owner->GatewayAlloc(s, buf);
  } else {
    s->owner->OnAlloc(s, buf);
  }
}

void OnReadCb(uv_stream_t* stream, ssize_t n, const uv_buf_t* /*buf*/) {
  auto* s = static_cast<Socket*>(stream->data);
  if (n == 0 || n == UV_ENOBUFS || s->closing) return;
  if (s->Control()) {
    s->owner->GatewayRead(s, n);
  } else {
    s->owner->OnRead(s, n);
  }
}


void OnCtlWriteCb(uv_write_t* /*req*/, int /*status*/) {
  // A failed hello or reply surfaces as a read error on the same socket.
}

namespace {

struct ControlWrite {
  uv_write_t req{};
  std::vector<unsigned char> bytes;
};

// Writes a control frame; a failure surfaces as a read error on the same connection.
void WriteControl(Socket* s, std::vector<unsigned char> frame) {
  auto w = std::make_unique<ControlWrite>();
  w->bytes = std::move(frame);
  w->req.data = w.get();
  uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(w->bytes.data()),
                           static_cast<unsigned>(w->bytes.size()));
  if (uv_write(&w->req, s->stream(), &b, 1, [](uv_write_t* req, int) {
        std::unique_ptr<ControlWrite>{static_cast<ControlWrite*>(req->data)}.reset();
      }) == 0) {
    w.release();
  }
}

void OnCloseCb(uv_handle_t* h) {
  std::unique_ptr<Socket> s(static_cast<Socket*>(h->data));
  s->owner->SocketClosed(s.get());
}

}  // namespace

void Comm::CloseSocket(Socket* s) {
  if (s->closing) return;
  s->closing = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&s->tcp), OnCloseCb);
}

Socket* Comm::DialGateway(const std::string& path, std::vector<unsigned char> request) {
  auto sock = std::make_unique<Socket>();
  uv_pipe_init(Loop().loop(), &sock->pipe, 0);
  Socket* s = sock.release();
  AdoptSocket(s);
  s->is_pipe = true;
  s->gateway = path;
  s->request = std::move(request);
  s->connect_req.data = s;
  uv_pipe_connect(&s->connect_req, &s->pipe, path.c_str(), [](uv_connect_t* req, int status) {
    auto* conn = static_cast<Socket*>(req->data);
    Comm* self = conn->owner;
    if (status == UV_ECANCELED || conn->closing) return;
    if (status < 0) {
      self->OnGatewayLost(conn, UnavailableError("cannot connect to the local gateway at " +
                                              conn->gateway + ": " + UvError(status) +
                                              "; is straitd running there (STRAIT_GATEWAY)?"));
      return;
    }
    WriteControl(conn, EncodeLocalHello("nccl-net-strait"));
    conn->in = Socket::In::kCtlLen;
    conn->filled = 0;
    const int rc = uv_read_start(conn->stream(), OnAllocCb, OnReadCb);
    if (rc != 0) {
      self->OnGatewayLost(conn, UnavailableError("cannot read from the local gateway at " +
                                              conn->gateway + ": " + UvError(rc)));
    }
  });
  return s;
}

void Comm::GatewayAlloc(Socket* s, uv_buf_t* buf) {
  if (s->in == Socket::In::kCtlLen) {
    *buf = uv_buf_init(reinterpret_cast<char*>(s->len4) + s->filled,
                       static_cast<unsigned>(4 - s->filled));
  } else {
    *buf = uv_buf_init(reinterpret_cast<char*>(s->ctl_in.data()) + s->filled,
                       static_cast<unsigned>(s->ctl_in.size() - s->filled));
  }
}

void Comm::GatewayRead(Socket* s, ssize_t n) {
  if (n < 0) {
    OnGatewayLost(s, UnavailableError(
                         n == UV_EOF ? "the local gateway at " + s->gateway +
                                           " closed the connection (straitd stopped or restarted?)"
                                     : "the connection to the local gateway at " + s->gateway +
                                           " failed: " + UvError(static_cast<int>(n))));
    return;
  }
  s->filled += static_cast<size_t>(n);
  if (s->in == Socket::In::kCtlLen) {
    if (s->filled < 4) return;
    const uint32_t len = GetU32(s->len4);
    if (len == 0 || len > kMaxControlBody) {
      OnGatewayLost(s, DataLossError("the gateway at " + s->gateway + " sent a " +
                                     std::to_string(len) +
                                     "-byte frame where a control message was due (protocol "
                                     "error)"));
      return;
    }
    s->ctl_in.assign(len, 0);
    s->in = Socket::In::kCtlBody;
    s->filled = 0;
    return;
  }
  if (s->filled < s->ctl_in.size()) return;
  s->in = Socket::In::kCtlLen;
  s->filled = 0;
  if (!s->hello_done) {
    StatusOr<LocalReply> reply = DecodeLocalReply(s->ctl_in.data(), s->ctl_in.size());
    if (!reply.ok()) {
      OnGatewayLost(s, reply.status().WithContext("hello to the gateway at " + s->gateway));
      return;
    }
    if (reply->reply_to != LocalType::kHello || reply->code != StatusCode::kOk) {
      OnGatewayLost(s, Status(reply->code == StatusCode::kOk ? StatusCode::kDataLoss : reply->code,
                              "the gateway at " + s->gateway + " refused this rank's hello: " +
                                  reply->text));
      return;
    }
    s->hello_done = true;
    WriteControl(s, std::move(s->request));
    return;
  }
  // The handler may switch the connection to data or close it: `s` is not touched after.
  OnGatewayFrame(s, s->ctl_in);
}

}  // namespace strait::nccl
