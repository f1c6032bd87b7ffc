// The listening side of a point-to-point connection: ListenComm owns the TCP listener whose
// address goes into the listen handle, answers the senders' hellos, and groups a connection's
// sockets into a RecvComm; with a gateway it also holds a tunnel listen on straitd and accepts
// incoming tunnels as RecvComms of their own. accept() pops what is ready. Internal to the
// transport; loop side except PopReady, the pool-state calls and the accessors.
#ifndef STRAIT_PLUGINS_NCCL_LISTEN_COMM_H_
#define STRAIT_PLUGINS_NCCL_LISTEN_COMM_H_

#include <uv.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "plugins/nccl/handle.h"
#include "plugins/nccl/recv_comm.h"
#include "plugins/nccl/transport_comm.h"

namespace strait::nccl {

// Wakes Transport::Listen when a pre-opened listener changes state (listen_pool.cc).
void NotifyListenPool();

class ListenComm final : public Comm {
 public:
  explicit ListenComm(uint64_t nonce) : Comm(Kind::kListen, 0), nonce_(nonce) {}

  Status Open(const sockaddr_storage& addr, sockaddr_storage* bound) {
    uv_tcp_init(Loop().loop(), &server_);
    server_.data = this;
    ++open_handles_;
    int rc = uv_tcp_bind(&server_, reinterpret_cast<const sockaddr*>(&addr), 0);
    if (rc == 0) {
      rc = uv_listen(reinterpret_cast<uv_stream_t*>(&server_), 128, &ListenComm::OnConnection);
    }
    if (rc != 0) {
      return UnavailableError("cannot listen on " + Describe(addr) + ": " + UvError(rc));
    }
    int len = sizeof(*bound);
    rc = uv_tcp_getsockname(&server_, reinterpret_cast<sockaddr*>(bound), &len);
    if (rc != 0) return UnavailableError("getsockname: " + UvError(rc));
    bound_ = *bound;
    return Status::Ok();
  }

  uint64_t nonce() const { return nonce_; }
  // The TCP listener's address (set by Open before the listener is handed out).
  const sockaddr_storage& bound() const { return bound_; }

  RecvComm* PopReady() {
    std::lock_guard<std::mutex> lock(ready_mu_);
    if (ready_.empty()) return nullptr;
    RecvComm* c = ready_.front();
    ready_.pop_front();
    return c;
  }

  // What listen() publishes for the gateway tunnel.
  struct TunnelInfo {
    uint64_t listen_id = 0;
    uint32_t shard = 0;
    std::string region;
  };
  // Loop side: opens the tunnel listen on the gateway at `path` next to the TCP listener.
  void StartTunnel(const std::string& path) {
    gateway_ = path;
    gw_ = DialGateway(path, EncodeTunnelListen());
  }
  // Pre-opened listeners (see the pool below). Any thread.
  enum class PoolState { kOpening, kReady, kFailed };
  PoolState pool_state() {
    std::lock_guard<std::mutex> lock(tunnel_mu_);
    return tunnel_state_ == kTunnelOpening     ? PoolState::kOpening
           : tunnel_state_ == kTunnelListening ? PoolState::kReady
                                               : PoolState::kFailed;
  }
  // Takes a pooled listener whose tunnel listen is up: true (and its tunnel) once, false if it
  // is not ready. From then on a lost gateway connection is WARNed (NCCL holds the listener).
  bool Claim(TunnelInfo* info) {
    std::lock_guard<std::mutex> lock(tunnel_mu_);
    if (tunnel_state_ != kTunnelListening || !pooled_) return false;
    pooled_ = false;
    *info = tunnel_;
    return true;
  }
  Status tunnel_error() {
    std::lock_guard<std::mutex> lock(tunnel_mu_);
    return tunnel_error_;
  }
  // Loop side, before StartTunnel: the listener waits in the pool until Claim.
  void MarkPooled() {
    std::lock_guard<std::mutex> lock(tunnel_mu_);
    pooled_ = true;
  }
  // Loop side: the listener could not be opened at all.
  void FailTunnel(const Status& why) {
    {
      std::lock_guard<std::mutex> lock(tunnel_mu_);
      tunnel_error_ = why;
      tunnel_state_ = kTunnelFailed;
    }
    NotifyListenPool();
  }

  void OnGatewayFrame(Socket* s, const std::vector<unsigned char>& body) override {
    StatusOr<LocalReply> reply = DecodeLocalReply(body.data(), body.size());
    Status st = reply.ok() ? Status::Ok() : reply.status();
    if (st.ok() && reply->reply_to != LocalType::kTunnelListen) {
      st = DataLossError("the gateway answered a tunnel listen with a reply to another request");
    } else if (st.ok() && reply->code != StatusCode::kOk) {
      st = Status(reply->code, "the gateway at " + gateway_ + " ended the tunnel listen: " +
                                   reply->text);
    }
    if (!st.ok()) {
      OnGatewayLost(s, st);
      return;
    }
    StatusOr<TunnelEvent> event = DecodeTunnelEvent(reply->data);
    if (!event.ok()) {
      OnGatewayLost(s, event.status());
      return;
    }
    if (event->kind == TunnelEventKind::kListening) {
      {
        std::lock_guard<std::mutex> lock(tunnel_mu_);
        tunnel_.listen_id = event->id;
        tunnel_.shard = event->shard;
        tunnel_.region = event->region;
        tunnel_state_ = kTunnelListening;
      }
      NotifyListenPool();
      return;
    }
    // An incoming tunnel: accept it on a connection of its own (NCCL's accept() picks it up).
    auto recv = std::make_unique<RecvComm>(
        "region " + event->region + " (tunnel " + std::to_string(event->id) + ")", true);
    RecvComm* raw = recv.release();
    accepting_.insert(raw);
    raw->StartAccept(gateway_, event->id, [this](RecvComm* c, const Status& result) {
      accepting_.erase(c);
      if (!result.ok()) {
        Transport::Get().Log(LogKind::kWarn, result.message());
        c->BeginClose();
        return;
      }
      std::lock_guard<std::mutex> lock(ready_mu_);
      ready_.push_back(c);
    });
  }

  void OnGatewayLost(Socket* s, const Status& why) override {
    bool opening = false;
    bool pooled = false;
    {
      std::lock_guard<std::mutex> lock(tunnel_mu_);
      opening = tunnel_state_ == kTunnelOpening;
      pooled = pooled_;
      // Still in the pool (nobody published its handle): it just becomes unusable.
      if (opening || pooled) {
        tunnel_error_ = why;
        tunnel_state_ = kTunnelFailed;
      }
    }
    NotifyListenPool();
    // Listening already: direct connections still work, cross-region connects to this rank
    // are refused by the gateways from now on.
    if (!opening && !pooled && !closing_) {
      Transport::Get().Log(LogKind::kWarn,
                           why.message() + "; the tunnel listen ended: ranks in other regions "
                                           "can no longer connect to this listener");
    }
    gw_ = nullptr;
    CloseSocket(s);
  }

  void OnAlloc(Socket* s, uv_buf_t* buf) override {
    if (s->in == Socket::In::kHello && !s->is_pipe) {
      *buf = uv_buf_init(reinterpret_cast<char*>(s->buf) + s->filled,
                         static_cast<unsigned>(kHelloSize - s->filled));
    }
  }

  void OnRead(Socket* s, ssize_t n) override {
    if (n < 0) {
      DropPending(s);
      return;
    }
    s->filled += static_cast<size_t>(n);
    if (s->filled < kHelloSize) return;
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&s->tcp));
    ReplyStatus why = ReplyStatus::kAccepted;
    StatusOr<Hello> hello = DecodeHello(s->buf, &why);
    if (hello.ok() && hello->nonce != nonce_) why = ReplyStatus::kUnknownListener;
    if (!hello.ok() || why != ReplyStatus::kAccepted) {
      // Someone else's connection (a stale handle, a port scanner): answer and drop it.
      EncodeReply(why, s->ctl);
      uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(s->ctl), kReplySize);
      s->ctl_write.data = s;
      const int rc =
          uv_write(&s->ctl_write, reinterpret_cast<uv_stream_t*>(&s->tcp), &b, 1,
                   [](uv_write_t* w, int) { CloseSocket(static_cast<Socket*>(w->data)); });
      if (rc != 0) CloseSocket(s);
      return;
    }
    s->index = hello->socket_index;
    auto& slots = partial_[hello->connection_id];
    if (slots.empty()) slots.assign(hello->socket_count, nullptr);
    if (slots.size() != hello->socket_count || slots[hello->socket_index] != nullptr) {
      DropPending(s);
      return;
    }
    slots[hello->socket_index] = s;
    Unlink(s);
    if (std::count(slots.begin(), slots.end(), nullptr) != 0) return;
    // Every socket of this connection has arrived: hand them to a new recv comm.
    sockaddr_storage peer{};
    int len = sizeof(peer);
    uv_tcp_getpeername(&slots[0]->tcp, reinterpret_cast<sockaddr*>(&peer), &len);
    auto recv = std::make_unique<RecvComm>(Describe(peer));
    for (Socket* sock : slots) {
      --open_handles_;
      recv->AdoptSocket(sock);
      EncodeReply(ReplyStatus::kAccepted, sock->ctl);
      uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(sock->ctl), kReplySize);
      uv_write(&sock->ctl_write, reinterpret_cast<uv_stream_t*>(&sock->tcp), &b, 1, OnCtlWriteCb);
    }
    partial_.erase(hello->connection_id);
    recv->StartReading();
    std::lock_guard<std::mutex> lock(ready_mu_);
    ready_.push_back(recv.release());
  }

 protected:
  void CloseHandles() override {
    if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&server_))) {
      uv_close(reinterpret_cast<uv_handle_t*>(&server_),
               [](uv_handle_t* h) { static_cast<ListenComm*>(h->data)->HandleClosed(); });
    }
    const std::vector<Socket*> pending = sockets_;
    for (Socket* s : pending) CloseSocket(s);
    for (auto& [id, slots] : partial_) {
      for (Socket* s : slots) {
        if (s != nullptr) CloseSocket(s);
      }
    }
    partial_.clear();
    // Tunnels being accepted at the gateway.
    for (RecvComm* c : accepting_) {
      c->DropOpenCallback();
      c->BeginClose();
    }
    accepting_.clear();
    // Connections that arrived but were never accepted.
    std::lock_guard<std::mutex> lock(ready_mu_);
    for (RecvComm* c : ready_) c->BeginClose();
    ready_.clear();
  }

 private:
  static void OnConnection(uv_stream_t* server, int status) {
    auto* self = static_cast<ListenComm*>(server->data);
    if (status < 0 || self->closing_) return;
    auto s = std::make_unique<Socket>();
    uv_tcp_init(Loop().loop(), &s->tcp);
    Socket* raw = s.release();
    self->AdoptSocket(raw);
    if (uv_accept(server, reinterpret_cast<uv_stream_t*>(&raw->tcp)) != 0) {
      self->DropPending(raw);
      return;
    }
    uv_tcp_nodelay(&raw->tcp, 1);
    raw->in = Socket::In::kHello;
    if (uv_read_start(reinterpret_cast<uv_stream_t*>(&raw->tcp), OnAllocCb, OnReadCb) != 0) {
      self->DropPending(raw);
    }
  }

  void Unlink(Socket* s) {
    sockets_.erase(std::remove(sockets_.begin(), sockets_.end(), s), sockets_.end());
  }
  void DropPending(Socket* s) { CloseSocket(s); }

  enum { kTunnelOpening, kTunnelListening, kTunnelFailed };

  uint64_t nonce_;
  std::string gateway_;
  Socket* gw_ = nullptr;  // the tunnel listen connection (loop side)
  std::unordered_set<RecvComm*> accepting_;
  std::mutex tunnel_mu_;
  int tunnel_state_ = kTunnelOpening;
  bool pooled_ = false;  // waiting in the pool: not yet handed to NCCL
  Status tunnel_error_;
  TunnelInfo tunnel_;
  sockaddr_storage bound_{};
  uv_tcp_t server_{};
  std::map<uint64_t, std::vector<Socket*>> partial_;  // connection id -> sockets by index
  std::mutex ready_mu_;
  std::deque<RecvComm*> ready_;
};

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_LISTEN_COMM_H_
