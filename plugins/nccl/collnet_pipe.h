// CollNet's connection to the node's straitd: one Unix connection driven by the plugin's libuv
// loop (event_loop.h), speaking the local protocol (lib/localproto/protocol.h) with localproto's
// own encoders and decoders. It says hello, then runs the requests queued with Call() one at a
// time, in order, each with its reply: register-job, tunnel-listen (to learn region and shard),
// join-job, and region all-reduce, whose tensor goes out straight from the caller's buffer and
// whose result is read straight into the caller's buffer. Internal to collnet.cc.
//
//   GatewayPipe* p = GatewayPipe::Open(loop, path, deadline);           // loop thread
//   Status s = p->Call(request, {}, {}, deadline, [](Status s, Message reply) { ... });
//   ...
//   p->Close();                                                           // always, once
//
// Deadlines: each call (and the connect and hello) is bounded by its own deadline, armed when the
// call is sent; one that passes breaks the connection (its bytes may be half exchanged).
// Failure: a lost or broken connection (straitd gone, a bad frame, a deadline) fails the call
// being run and every queued one with the same Status, named "connection to straitd at PATH";
// later Call()s return that Status at once. A reply with an error code fails only its call, as
// Status(code, "straitd at PATH: reason"), and the connection goes on.
//
// Threading: loop thread only, every method and every callback. Ownership: the pipe owns its
// libuv handles and frees itself once Close() was called and libuv has closed them (libuv's rule:
// a handle's memory goes only in its close callback). Callers' buffers must stay valid until the
// call's callback ran or Close() returned; no callback runs after Close().
#ifndef STRAIT_PLUGINS_NCCL_COLLNET_PIPE_H_
#define STRAIT_PLUGINS_NCCL_COLLNET_PIPE_H_

#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "localproto/protocol.h"
#include "strait/status.h"

namespace strait::nccl {

class GatewayPipe {
 public:
  using Message = localproto::Message;
  // The call's outcome: OK with the reply (code, text, and data unless it went into `recv`), or
  // why not.
  using Done = std::function<void(Status status, Message reply)>;

  // Starts connecting to straitd's socket at `path` and exchanging hellos (client name
  // `client_name`) by `deadline`. Never fails here: a failure surfaces in the calls, and in
  // `ready` (may be empty), which runs once the hello is answered, with OK or why not.
  static GatewayPipe* Open(uv_loop_t* loop, std::string path, std::string client_name,
                           Deadline deadline, std::function<void(Status)> ready = {});

  ~GatewayPipe() = default;  // only through Close(): the pipe frees itself
  GatewayPipe(const GatewayPipe&) = delete;
  GatewayPipe& operator=(const GatewayPipe&) = delete;

  // Queues `request`. With `send` non-empty, the request's data are those bytes (request.data is
  // ignored), written straight from the caller's buffer. With `recv` non-empty, an OK reply must
  // carry exactly recv.size() data bytes, read straight into `recv` (else the connection is
  // broken with kDataLoss); otherwise the reply's data (at most kMaxControlBodyBytes) comes in
  // reply.data. `done` runs once, on the loop, unless Close() comes first. An error returned
  // here (a request the protocol refuses, a connection already broken) means `done` never runs.
  // With `pass_fd` >= 0, one byte carrying that descriptor (SCM_RIGHTS) follows the request
  // (kAttachShm); the caller keeps the descriptor open until `done`.
  Status Call(const Message& request, std::span<const uint8_t> send, std::span<uint8_t> recv,
              Deadline deadline, Done done, int pass_fd = -1);

  // Stops all I/O at once; no callback runs afterwards. The pipe frees itself later.
  void Close();

  const std::string& path() const { return path_; }

 private:
  struct Pending {
    localproto::MessageType type = localproto::MessageType::kHello;
    std::vector<uint8_t> head;  // the frame, or its head when `send` follows
    std::span<const uint8_t> send;
    std::span<uint8_t> recv;
    Deadline deadline = Deadline::Infinite();
    Done done;
    int pass_fd = -1;
  };
  enum class In { kLength, kFixedHead, kHeadRest, kData };

  GatewayPipe(std::string path, std::string client_name)
      : path_(std::move(path)), client_name_(std::move(client_name)) {}

  static void OnConnect(uv_connect_t* req, int status);
  static void OnAlloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf);
  static void OnRead(uv_stream_t* stream, ssize_t n, const uv_buf_t* buf);
  static void OnWrite(uv_write_t* req, int status);
  static void OnTimer(uv_timer_t* timer);
  static void OnClosed(uv_handle_t* h);

  void StartNext();
  void Arm(Deadline deadline);
  void Read(size_t n);
  void HeadDone();
  void MaybeFinish();
  // Breaks the connection: every call fails with `why` (given the connection's context).
  void Fail(const Status& why);
  void CloseHandles();

  const std::string path_;
  const std::string client_name_;
  uv_pipe_t pipe_{};
  uv_timer_t timer_{};
  uv_connect_t connect_req_{};
  uv_write_t write_req_{};
  int open_handles_ = 0;
  bool handles_closing_ = false;
  bool closed_ = false;  // Close() was called
  bool connected_ = false;
  Status broken_;

  std::deque<Pending> calls_;  // the front is being run once `active_`
  bool active_ = false;
  bool writing_ = false;
  bool replied_ = false;
  Status reply_status_;
  Message reply_;

  // The reply being read.
  In in_ = In::kLength;
  uint8_t len4_[4] = {};
  uint32_t length_ = 0;
  std::vector<uint8_t> head_;
  size_t head_size_ = 0;
  uint8_t* dest_ = nullptr;  // where the reply's data goes
  size_t want_ = 0;          // bytes of the current part
  size_t filled_ = 0;        // of them, read so far
  std::vector<uint8_t> data_;
};

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_COLLNET_PIPE_H_
