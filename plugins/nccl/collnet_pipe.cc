// CollNet's loop-driven connection to straitd (see collnet_pipe.h).
#include "plugins/nccl/collnet_pipe.h"

#include <sys/un.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <utility>

#include "common/endian.h"
#include "localproto/shm.h"

namespace strait::nccl {
namespace {

using localproto::Message;
using localproto::MessageType;

std::string UvText(int rc) {
  return std::string(uv_err_name(rc)) + " (" + uv_strerror(rc) + ")";
}

// A reply's fixed head: type, reply type, u32 code, u16 text length (protocol.h, kReply).
constexpr size_t kFixedHead = 1 + 1 + 4 + 2;

}  // namespace

GatewayPipe* GatewayPipe::Open(uv_loop_t* loop, std::string path, std::string client_name,
                               Deadline deadline, std::function<void(Status)> ready) {
  std::unique_ptr<GatewayPipe> owned(new GatewayPipe(std::move(path), std::move(client_name)));
  GatewayPipe* p = owned.release();  // freed by OnClosed once Close() was called
  uv_pipe_init(loop, &p->pipe_, 0);
  p->pipe_.data = p;
  uv_timer_init(loop, &p->timer_);
  p->timer_.data = p;
  p->open_handles_ = 2;
  // The hello is the first call; its failure becomes every later call's.
  Message hello;
  hello.type = MessageType::kHello;
  hello.client_name = p->client_name_;
  StatusOr<std::vector<uint8_t>> frame = localproto::EncodeMessage(hello);
  sockaddr_un addr{};
  Status bad = frame.status();
  if (bad.ok() && (p->path_.empty() || p->path_.size() >= sizeof(addr.sun_path))) {
    bad = InvalidArgumentError("straitd socket path \"" + p->path_ + "\" must be 1-" +
                               std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  if (!bad.ok()) {
    p->Fail(bad);
    if (ready) ready(bad);
    return p;
  }
  Pending c;
  c.type = MessageType::kHello;
  c.head = std::move(*frame);
  c.deadline = deadline;
  if (ready) c.done = [ready = std::move(ready)](Status s, Message) { ready(std::move(s)); };
  p->calls_.push_back(std::move(c));
  p->Arm(deadline);
  p->connect_req_.data = p;
  uv_pipe_connect(&p->connect_req_, &p->pipe_, p->path_.c_str(), &GatewayPipe::OnConnect);
  return p;
}

Status GatewayPipe::Call(const Message& request, std::span<const uint8_t> send,
                         std::span<uint8_t> recv, Deadline deadline, Done done,
                         int pass_fd) {
  if (closed_) return InternalError("a call on a closed connection to straitd");
  if (!broken_.ok()) return broken_;
  Pending c;
  c.type = request.type;
  StatusOr<std::vector<uint8_t>> head = send.empty()
                                            ? localproto::EncodeMessage(request)
                                            : localproto::EncodeMessageHead(request, send.size());
  if (!head.ok()) return head.status();
  c.head = std::move(*head);
  c.send = send;
  c.recv = recv;
  c.deadline = deadline;
  c.done = std::move(done);
  c.pass_fd = pass_fd;
  calls_.push_back(std::move(c));
  StartNext();
  return Status::Ok();
}

void GatewayPipe::Close() {
  if (closed_) return;
  closed_ = true;
  calls_.clear();
  active_ = false;
  CloseHandles();
  if (open_handles_ == 0) std::unique_ptr<GatewayPipe>{this}.reset();
}

void GatewayPipe::StartNext() {
  if (closed_ || active_ || !connected_ || !broken_.ok() || calls_.empty()) return;
  Pending& c = calls_.front();
  active_ = true;
  writing_ = true;
  replied_ = false;
  reply_status_ = Status::Ok();
  Arm(c.deadline);
  uv_buf_t bufs[2];
  unsigned n = 0;
  bufs[n++] = uv_buf_init(reinterpret_cast<char*>(c.head.data()),
                          static_cast<unsigned>(c.head.size()));
  if (!c.send.empty()) {
    // Both point into buffers that outlive the write: the call's head, the caller's tensor.
    bufs[n++] = uv_buf_init(const_cast<char*>(reinterpret_cast<const char*>(c.send.data())),
                            static_cast<unsigned>(c.send.size()));
  }
  write_req_.data = this;
  const int rc = uv_write(&write_req_, reinterpret_cast<uv_stream_t*>(&pipe_), bufs, n,
                          &GatewayPipe::OnWrite);
  if (rc != 0) {
    writing_ = false;
    Fail(UnavailableError("local socket: write failed: " + UvText(rc))
             .WithContext("connection to straitd at " + path_));
  }
}

void GatewayPipe::Arm(Deadline deadline) {
  if (deadline.IsInfinite()) {
    uv_timer_stop(&timer_);
    return;
  }
  const uint64_t ms = static_cast<uint64_t>(deadline.RemainingNanos() / 1'000'000) + 1;
  uv_timer_start(&timer_, &GatewayPipe::OnTimer, ms, 0);
}

void GatewayPipe::OnConnect(uv_connect_t* req, int status) {
  auto* p = static_cast<GatewayPipe*>(req->data);
  if (status == UV_ECANCELED || p->handles_closing_) return;
  if (status < 0) {
    p->Fail(UnavailableError("cannot reach straitd at STRAIT_GATEWAY=\"" + p->path_ +
                             "\": cannot connect: " + UvText(status) +
                             "; start the node's straitd or fix STRAIT_GATEWAY"));
    return;
  }
  p->connected_ = true;
  const int rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&p->pipe_), &GatewayPipe::OnAlloc,
                               &GatewayPipe::OnRead);
  if (rc != 0) {
    p->Fail(UnavailableError("local socket: cannot read: " + UvText(rc))
                .WithContext("connection to straitd at " + p->path_));
    return;
  }
  p->StartNext();
}

void GatewayPipe::OnAlloc(uv_handle_t* h, size_t /*suggested*/, uv_buf_t* buf) {
  auto* p = static_cast<GatewayPipe*>(h->data);
  *buf = uv_buf_init(nullptr, 0);
  if (p->handles_closing_) return;
  switch (p->in_) {
    case In::kLength:
      *buf = uv_buf_init(reinterpret_cast<char*>(p->len4_) + p->filled_,
                         static_cast<unsigned>(sizeof(p->len4_) - p->filled_));
      return;
    case In::kFixedHead:
    case In::kHeadRest:
      *buf = uv_buf_init(reinterpret_cast<char*>(p->head_.data()) + p->filled_,
                         static_cast<unsigned>(p->want_ - p->filled_));
      return;
    case In::kData:
      *buf = uv_buf_init(reinterpret_cast<char*>(p->dest_) + p->filled_,
                         static_cast<unsigned>(std::min<size_t>(p->want_ - p->filled_, INT_MAX)));
      return;
  }
}

void GatewayPipe::OnRead(uv_stream_t* stream, ssize_t n, const uv_buf_t* /*buf*/) {
  auto* p = static_cast<GatewayPipe*>(stream->data);
  if (n == 0 || n == UV_ENOBUFS || p->handles_closing_) return;
  if (n < 0) {
    Status why;
    if (n != UV_EOF) {
      why = UnavailableError("local socket: read failed: " + UvText(static_cast<int>(n)));
    } else if (p->in_ == In::kLength && p->filled_ == 0) {
      why = UnavailableError("local socket: connection closed by the peer");
    } else {
      why = DataLossError("local socket: connection closed inside a frame");
    }
    p->Fail(why.WithContext("connection to straitd at " + p->path_));
    return;
  }
  p->Read(static_cast<size_t>(n));
}

void GatewayPipe::Read(size_t n) {
  filled_ += n;
  switch (in_) {
    case In::kLength: {
      if (filled_ < sizeof(len4_)) return;
      const auto lost = [&](Status s) {
        Fail(s.WithContext("connection to straitd at " + path_));
      };
      if (!active_) return lost(DataLossError("straitd sent a frame that answers no request"));
      length_ = GetU32(len4_);
      if (length_ == 0) return lost(InvalidArgumentError("local frame with an empty body"));
      if (length_ > localproto::kDefaultMaxMessageBytes) {
        return lost(ResourceExhaustedError("local frame of " + std::to_string(length_) +
                                           " bytes exceeds the limit of " +
                                           std::to_string(localproto::kDefaultMaxMessageBytes) +
                                           " bytes"));
      }
      head_.assign(std::min<size_t>(length_, kFixedHead), 0);
      want_ = head_.size();
      filled_ = 0;
      in_ = In::kFixedHead;
      return;
    }
    case In::kFixedHead:
      if (filled_ < want_) return;
      head_size_ = length_;  // not a reply's head: all of it; DecodeMessage says what is wrong
      if (head_.size() == kFixedHead && head_[0] == static_cast<uint8_t>(MessageType::kReply)) {
        head_size_ = std::min<size_t>(length_, kFixedHead + size_t{GetU16(head_.data() + 6)});
      }
      if (head_size_ > head_.size()) {
        head_.resize(head_size_);
        want_ = head_size_;
        in_ = In::kHeadRest;
        return;
      }
      HeadDone();
      return;
    case In::kHeadRest:
      if (filled_ < want_) return;
      HeadDone();
      return;
    case In::kData:
      if (filled_ < want_) return;
      in_ = In::kLength;
      filled_ = 0;
      if (dest_ == data_.data()) reply_.data = std::move(data_);
      data_.clear();
      replied_ = true;
      MaybeFinish();
      return;
  }
}

void GatewayPipe::HeadDone() {
  const auto lost = [&](Status s) { Fail(s.WithContext("connection to straitd at " + path_)); };
  StatusOr<Message> m = localproto::DecodeMessage(head_);
  if (!m.ok()) return lost(m.status().WithContext("bad reply from the gateway"));
  const Pending& c = calls_.front();
  const char* expect = localproto::MessageTypeName(c.type);
  if (m->type != MessageType::kReply || m->reply_to != c.type) {
    // An error reply to another type is straitd refusing the request's framing.
    if (m->type == MessageType::kReply && m->code != StatusCode::kOk) {
      return lost(Status(m->code, "gateway refused the " + std::string(expect) +
                                      " request: " + m->text));
    }
    return lost(InternalError(std::string("gateway answered a ") + expect + " request with a " +
                              localproto::MessageTypeName(m->type) + " to " +
                              localproto::MessageTypeName(m->reply_to)));
  }
  const size_t data_size = length_ - head_size_;
  reply_ = std::move(*m);
  if (reply_.code != StatusCode::kOk) {
    reply_status_ = Status(reply_.code, "straitd at " + path_ + ": " + reply_.text);
  }
  if (reply_.code == StatusCode::kOk && !c.recv.empty()) {
    if (data_size != c.recv.size()) {
      return Fail(DataLossError("straitd at " + path_ + " returned " + std::to_string(data_size) +
                                " bytes for a " + std::to_string(c.recv.size()) +
                                "-byte all-reduce"));
    }
    dest_ = c.recv.data();
  } else {
    if (data_size > localproto::kMaxControlBodyBytes) {
      return Fail(DataLossError("straitd at " + path_ + " sent a " + expect + " reply with " +
                                std::to_string(data_size) + " data bytes"));
    }
    data_.assign(data_size, 0);
    dest_ = data_.data();
  }
  want_ = data_size;
  filled_ = 0;
  in_ = In::kData;
  if (want_ == 0) Read(0);
}

void GatewayPipe::OnWrite(uv_write_t* req, int status) {
  auto* p = static_cast<GatewayPipe*>(req->data);
  p->writing_ = false;
  if (status == UV_ECANCELED || p->handles_closing_) return;
  if (status < 0) {
    p->Fail(UnavailableError("local socket: write failed: " + UvText(status))
                .WithContext("connection to straitd at " + p->path_));
    return;
  }
  if (!p->calls_.empty() && p->calls_.front().pass_fd >= 0) {
    // The request's bytes are with the kernel, so the one byte fits at once (one try: the
    // loop never waits); straitd reads it right after the request.
    uv_os_fd_t fd = -1;
    Status s = uv_fileno(reinterpret_cast<uv_handle_t*>(&p->pipe_), &fd) == 0
                   ? localproto::SendFd(fd, p->calls_.front().pass_fd, Deadline::After(0))
                   : UnavailableError("the connection has no descriptor");
    if (!s.ok()) return p->Fail(s.WithContext("connection to straitd at " + p->path_));
  }
  p->MaybeFinish();
}

void GatewayPipe::OnTimer(uv_timer_t* timer) {
  auto* p = static_cast<GatewayPipe*>(timer->data);
  if (p->handles_closing_) return;
  const char* what = !p->connected_ ? "connecting"
                     : p->writing_  ? "writing the request"
                                    : "waiting for the reply";
  p->Fail(DeadlineExceededError(std::string("local socket: timed out ") + what)
              .WithContext("connection to straitd at " + p->path_));
}

void GatewayPipe::MaybeFinish() {
  if (!active_ || writing_ || !replied_) return;
  Pending c = std::move(calls_.front());
  calls_.pop_front();
  active_ = false;
  replied_ = false;
  uv_timer_stop(&timer_);
  Status s = std::move(reply_status_);
  reply_status_ = Status::Ok();
  Message reply = std::move(reply_);
  reply_ = Message();
  if (c.type == MessageType::kHello) {
    if (c.done) c.done(s, Message());
    if (!s.ok()) return Fail(s);  // refused (uid, version): every queued call fails with it
  } else if (c.done) {
    c.done(std::move(s), std::move(reply));  // may queue the next call, or Close()
  }
  StartNext();
}

void GatewayPipe::Fail(const Status& why) {
  if (!broken_.ok()) return;
  broken_ = why;
  CloseHandles();
  std::deque<Pending> calls = std::move(calls_);
  calls_.clear();
  active_ = false;
  for (Pending& c : calls) {
    if (closed_) break;  // a callback closed the pipe: nothing more is reported
    if (c.done) c.done(why, Message());
  }
}

void GatewayPipe::CloseHandles() {
  if (handles_closing_) return;
  handles_closing_ = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&pipe_), &GatewayPipe::OnClosed);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), &GatewayPipe::OnClosed);
}

void GatewayPipe::OnClosed(uv_handle_t* h) {
  auto* p = static_cast<GatewayPipe*>(h->data);
  if (--p->open_handles_ == 0 && p->closed_) std::unique_ptr<GatewayPipe>{p}.reset();
}

}  // namespace strait::nccl
