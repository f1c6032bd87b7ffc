// The local-protocol client (see client.h).
#include "localproto/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/endian.h"
#include "localproto/frame_io.h"

namespace strait::localproto {
namespace {

// A request's timeout_ms: what is left of `deadline` (0: none), at least 1 ms.
uint32_t TimeoutMs(Deadline deadline) {
  const int64_t left_ms = deadline.RemainingNanos() / 1'000'000;
  return deadline.IsInfinite() ? 0
                               : static_cast<uint32_t>(std::clamp<int64_t>(left_ms, 1, UINT32_MAX));
}

// An all-reduce request's fields.
Message AllReduceMessage(MessageType type, const std::string& job, const std::string& tensor_key,
                         DataType dtype, ReduceOp op, size_t count, Deadline deadline) {
  Message m;
  m.type = type;
  m.job = job;
  m.tensor_key = tensor_key;
  m.dtype = dtype;
  m.op = op;
  m.count = count;
  m.timeout_ms = TimeoutMs(deadline);
  return m;
}

// When to stop waiting for an all-reduce's reply: the gateway gives up at `deadline`; wait a
// moment longer for its answer, which says which peer or phase was late, rather than reporting
// a bare local timeout.
Deadline AllReduceReplyBy(Deadline deadline) {
  return deadline.IsInfinite()
             ? deadline
             : Deadline::After(deadline.RemainingNanos() +
                               std::max<int64_t>(500'000'000, deadline.RemainingNanos() / 10));
}

}  // namespace

StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path, Deadline deadline,
                                                  const std::string& client_name,
                                                  uint32_t shard) {
  STRAIT_ASSIGN_OR_RETURN(int fd, Dial(socket_path, deadline, client_name, true, shard));
  return std::unique_ptr<Client>(new Client(fd));  // private constructor
}

Client::~Client() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<Message> Client::ReadReply(MessageType expect, Deadline deadline) {
  auto reply = localproto::ReadReply(fd_, expect, deadline);
  if (!reply.ok()) broken_ = true;
  return reply;
}

StatusOr<Message> Client::Call(const Message& request, Deadline deadline) {
  if (broken_) return UnavailableError("connection to the gateway failed earlier; reconnect");
  STRAIT_ASSIGN_OR_RETURN(std::vector<uint8_t> frame, EncodeMessage(request));
  Status s = WriteAll(fd_, frame, deadline);
  if (!s.ok()) {
    broken_ = true;
    return s;
  }
  return ReadReply(request.type, deadline);
}

StatusOr<std::string> Client::RegisterJob(const std::string& job, const std::string& policy,
                                          Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  Message m;
  m.type = MessageType::kRegisterJob;
  m.job = job;
  m.policy = policy;
  STRAIT_ASSIGN_OR_RETURN(Message reply, Call(m, deadline));
  if (reply.code != StatusCode::kOk) return Status(reply.code, reply.text);
  return reply.text;
}

StatusOr<uint64_t> Client::JoinLocked(const std::string& job, Deadline deadline,
                                      uint64_t resume) {
  Message m;
  m.type = MessageType::kJoinJob;
  m.job = job;
  m.resume = resume;
  m.timeout_ms = TimeoutMs(deadline);
  // As for all-reduces: the gateway answers at the deadline with who is missing.
  const Deadline reply_by =
      deadline.IsInfinite() ? deadline
                            : Deadline::After(deadline.RemainingNanos() + 500'000'000);
  STRAIT_ASSIGN_OR_RETURN(Message reply, Call(m, reply_by));
  if (reply.code != StatusCode::kOk) return Status(reply.code, reply.text);
  if (reply.data.size() != 8 || GetU64(reply.data.data()) == 0) {
    broken_ = true;
    return InternalError("gateway answered join-job with " + std::to_string(reply.data.size()) +
                         " data bytes; expected a nonzero 8-byte generation");
  }
  Session& session = sessions_[job];
  session.generation = GetU64(reply.data.data());
  session.next = 0;
  session.rejoin = false;
  return session.generation;
}

StatusOr<uint64_t> Client::JoinJob(const std::string& job, Deadline deadline, uint64_t resume) {
  std::lock_guard<std::mutex> lock(mu_);
  return JoinLocked(job, deadline, resume);
}

Status Client::NextIdentity(const std::string& job, Deadline deadline, Message* m) {
  auto it = sessions_.find(job);
  if (it == sessions_.end() || it->second.rejoin) {
    STRAIT_RETURN_IF_ERROR(JoinLocked(job, deadline).status());
    it = sessions_.find(job);
  }
  m->generation = it->second.generation;
  m->sequence = it->second.next++;
  it->second.last = {m->generation, m->sequence};
  return Status::Ok();
}

bool Client::broken() {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

std::pair<uint64_t, uint64_t> Client::LastIdentity(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(job);
  return it == sessions_.end() ? std::pair<uint64_t, uint64_t>{0, 0} : it->second.last;
}

StatusOr<std::vector<uint8_t>> Client::FetchResult(const std::string& job, uint64_t generation,
                                                   uint64_t sequence, Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  Message m;
  m.type = MessageType::kFetchResult;
  m.job = job;
  m.generation = generation;
  m.sequence = sequence;
  m.timeout_ms = TimeoutMs(deadline);
  const Deadline reply_by =
      deadline.IsInfinite() ? deadline
                            : Deadline::After(deadline.RemainingNanos() + 500'000'000);
  STRAIT_ASSIGN_OR_RETURN(Message reply, Call(m, reply_by));
  if (reply.code != StatusCode::kOk) return Status(reply.code, reply.text);
  return std::move(reply.data);
}

Status Client::Finished(const std::string& job, Status s, bool refused) {
  if (s.ok()) return s;
  Session& session = sessions_[job];
  if (refused) {
    // Refused before the step was used: the same step number goes out with the next request.
    if (session.next > 0) --session.next;
  } else {
    // A failed step ends the generation for this client: every region failed it too (the
    // gateways make failures symmetric), and the next call starts a new one with them.
    session.rejoin = true;
  }
  return s;
}

Status Client::AllReduce(const std::string& job, const std::string& tensor_key, DataType dtype,
                         ReduceOp op, void* data, size_t count, Deadline deadline) {
  return AllReduceAs(MessageType::kAllReduce, job, tensor_key, dtype, op, data, count, deadline);
}

Status Client::RegionAllReduce(const std::string& job, const std::string& tensor_key,
                               DataType dtype, ReduceOp op, void* data, size_t count,
                               Deadline deadline) {
  return AllReduceAs(MessageType::kRegionAllReduce, job, tensor_key, dtype, op, data, count,
                     deadline);
}

Status Client::AllReduceAs(MessageType type, const std::string& job,
                           const std::string& tensor_key, DataType dtype, ReduceOp op, void* data,
                           size_t count, Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t elem = DataTypeSize(dtype);
  if (elem == 0) return InvalidArgumentError("all-reduce: invalid dtype");
  if (count > 0 && data == nullptr) return InvalidArgumentError("all-reduce: data is null");
  Message m = AllReduceMessage(type, job, tensor_key, dtype, op, count, deadline);
  const Deadline reply_by = AllReduceReplyBy(deadline);
  const size_t bytes = count * elem;
  if (broken_) return UnavailableError("connection to the gateway failed earlier; reconnect");
  ShmRegion* region = nullptr;
  if (type == MessageType::kAllReduce) {
    Status attach;
    region = RegionFor(bytes, reply_by, &attach);
    if (!attach.ok()) return attach;
  }
  STRAIT_RETURN_IF_ERROR(NextIdentity(job, deadline, &m));
  if (region != nullptr) {
    // The caller's buffer is written only on success, as on the socket path.
    std::memcpy(region->data(), data, bytes);
    Status s = SharedAllReduceLocked(job, &m, reply_by);
    if (s.ok()) std::memcpy(data, region->data(), bytes);
    return s;
  }
  // The tensor goes out straight from the caller's buffer and the result comes back straight
  // into it: no tensor-sized buffer is allocated (and faulted in) per call on this side.
  auto encoded = EncodeMessageHead(m, bytes);
  if (!encoded.ok()) return Finished(job, encoded.status(), /*refused=*/true);  // never sent
  const std::vector<uint8_t>& head = *encoded;
  Status s = WriteAll(fd_, head, reply_by);
  if (s.ok() && bytes > 0) {
    s = WriteAll(fd_, std::span<const uint8_t>(static_cast<const uint8_t*>(data), bytes),
                 reply_by);
  }
  if (!s.ok()) {
    broken_ = true;
    return Finished(job, s, false);
  }
  bool refused = false;
  Status read = ReadAllReduceReply(type, data, bytes, reply_by, &refused);
  return Finished(job, std::move(read), refused);
}

Status Client::SharedAllReduceLocked(const std::string& job, Message* m, Deadline reply_by) {
  // Only the descriptor crosses the socket; the gateway reduces the region in place.
  m->type = MessageType::kAllReduceShm;
  m->shm_offset = 0;
  Status sent = WriteMessage(fd_, *m, reply_by);
  if (!sent.ok()) {
    broken_ = true;
    return Finished(job, sent, false);
  }
  bool refused = false;
  Status read = ReadAllReduceReply(m->type, nullptr, 0, reply_by, &refused);
  return Finished(job, std::move(read), refused);
}

StatusOr<std::span<uint8_t>> Client::SharedBuffer(size_t bytes, Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return UnavailableError("connection to the gateway failed earlier; reconnect");
  if (bytes == 0 || bytes > kMaxShmBytes) {
    return InvalidArgumentError("shared buffer: " + std::to_string(bytes) +
                                " bytes; it holds 1 byte to " + std::to_string(kMaxShmBytes));
  }
  if (!shm_off_ && (shm_ == nullptr || shm_->size() < bytes)) {
    STRAIT_RETURN_IF_ERROR(AttachLocked(bytes, deadline));
  }
  if (shm_off_ || shm_ == nullptr) {
    return FailedPreconditionError(
        "shared buffer: the gateway takes no shared region from this client (an older gateway, "
        "no memfd here, or UseSharedMemory(false)); use AllReduce with your own buffer");
  }
  return std::span<uint8_t>(static_cast<uint8_t*>(shm_->data()), bytes);
}

Status Client::AllReduceShared(const std::string& job, const std::string& tensor_key,
                               DataType dtype, ReduceOp op, size_t count, Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t elem = DataTypeSize(dtype);
  if (elem == 0) return InvalidArgumentError("all-reduce: invalid dtype");
  if (broken_) return UnavailableError("connection to the gateway failed earlier; reconnect");
  if (count > kMaxShmBytes / elem) {
    return InvalidArgumentError("all-reduce of the shared buffer: " + std::to_string(count) +
                                " elements are more than a shared buffer holds (" +
                                std::to_string(kMaxShmBytes) + " bytes)");
  }
  const size_t bytes = count * elem;
  const size_t have = shm_ == nullptr || shm_off_ ? 0 : shm_->size();
  if (bytes == 0 || bytes > have) {
    return FailedPreconditionError("all-reduce of the shared buffer: it holds " +
                                   std::to_string(have) + " bytes, the tensor " +
                                   std::to_string(bytes) + "; call SharedBuffer(" +
                                   std::to_string(bytes) + ") first and write the tensor there");
  }
  Message m = AllReduceMessage(MessageType::kAllReduce, job, tensor_key, dtype, op, count, deadline);
  const Deadline reply_by = AllReduceReplyBy(deadline);
  STRAIT_RETURN_IF_ERROR(NextIdentity(job, deadline, &m));
  return SharedAllReduceLocked(job, &m, reply_by);
}

void Client::UseSharedMemory(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  shm_off_ = !on;
  if (!on) shm_.reset();
}

size_t Client::shared_region_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return shm_ == nullptr ? 0 : shm_->size();
}

ShmRegion* Client::RegionFor(size_t bytes, Deadline deadline, Status* error) {
  if (shm_off_ || bytes < kShmMinBytes || bytes > kMaxShmBytes) return nullptr;
  if (shm_ == nullptr || shm_->size() < bytes) {
    *error = AttachLocked(bytes, deadline);
    if (!error->ok()) return nullptr;
  }
  return shm_.get();
}

Status Client::AttachLocked(size_t bytes, Deadline deadline) {
  // Doubling up to the tensor, so that a model whose buckets grow attaches a few times only.
  size_t size = shm_ == nullptr ? bytes : std::max(bytes, std::min<size_t>(2 * shm_->size(),
                                                                           kMaxShmBytes));
  shm_.reset();
  auto region = ShmRegion::Create(size);
  if (!region.ok()) {  // no memfd here: the socket still works
    shm_off_ = true;
    return Status::Ok();
  }
  Message m;
  m.type = MessageType::kAttachShm;
  m.shm_bytes = size;
  Status s = WriteMessage(fd_, m, deadline);
  if (s.ok()) s = SendFd(fd_, (*region)->fd(), deadline);
  if (!s.ok()) {
    broken_ = true;
    return s;
  }
  StatusOr<Message> reply = ReadReply(MessageType::kAttachShm, deadline);
  if (!reply.ok()) return reply.status();  // ReadReply marked the connection broken
  if (reply->code != StatusCode::kOk) {
    // An older gateway (unknown type) or one that refuses the region: the socket carries on.
    shm_off_ = true;
    return Status::Ok();
  }
  shm_ = std::move(region).value();
  return Status::Ok();
}

Status Client::ReadAllReduceReply(MessageType type, void* data, size_t bytes, Deadline deadline,
                                  bool* refused) {
  // Every failure to read a well-formed reply leaves the connection out of step: broken.
  auto fail = [this](Status s) {
    broken_ = true;
    return s;
  };
  size_t data_size = 0;
  auto reply = ReadReplyHead(fd_, type, deadline, &data_size);
  if (!reply.ok()) return fail(reply.status());
  if (reply->code != StatusCode::kOk) {
    // The gateway's error replies carry at most the one-byte refusal marker ("Operation
    // identity" in protocol.h); the caller's buffer stays as it was.
    if (data_size > 1) {
      broken_ = true;
    } else if (data_size == 1) {
      uint8_t marker = 1;
      if (Status s = ReadFrameBytes(fd_, std::span<uint8_t>(&marker, 1), deadline); !s.ok()) {
        return fail(s);
      }
      *refused = marker == 0;
    }
    return Status(reply->code, reply->text);
  }
  if (data_size != bytes) {
    return fail(InternalError("gateway returned " + std::to_string(data_size) +
                              " bytes for an all-reduce of " + std::to_string(bytes)));
  }
  if (bytes > 0) {
    if (Status s = ReadFrameBytes(fd_, std::span<uint8_t>(static_cast<uint8_t*>(data), bytes),
                                  deadline);
        !s.ok()) {
      return fail(s);
    }
  }
  return Status::Ok();
}

Status Client::AllReduceFrame(const std::string& job, const std::string& tensor_key, ReduceOp op,
                              std::span<const uint8_t> frame_in, std::vector<uint8_t>* frame_out,
                              Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (frame_out == nullptr) return InvalidArgumentError("all-reduce-frame: frame_out is null");
  Message m;
  m.type = MessageType::kAllReduceFrame;
  m.job = job;
  m.tensor_key = tensor_key;
  m.op = op;
  m.timeout_ms = TimeoutMs(deadline);
  const Deadline reply_by = AllReduceReplyBy(deadline);
  if (broken_) return UnavailableError("connection to the gateway failed earlier; reconnect");
  STRAIT_RETURN_IF_ERROR(NextIdentity(job, deadline, &m));
  auto encoded = EncodeMessageHead(m, frame_in.size());
  if (!encoded.ok()) return Finished(job, encoded.status(), /*refused=*/true);  // never sent
  const std::vector<uint8_t>& head = *encoded;
  Status s = WriteAll(fd_, head, reply_by);
  if (s.ok() && !frame_in.empty()) s = WriteAll(fd_, frame_in, reply_by);
  if (!s.ok()) {
    broken_ = true;
    return Finished(job, s, false);
  }
  auto reply = ReadReply(m.type, reply_by);
  if (!reply.ok()) return Finished(job, reply.status(), false);
  if (reply->code != StatusCode::kOk) {
    const bool refused = reply->data.size() == 1 && reply->data[0] == 0;
    return Finished(job, Status(reply->code, reply->text), refused);
  }
  *frame_out = std::move(reply->data);
  return Status::Ok();
}

StatusOr<std::string> Client::Stats(Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  Message m;
  m.type = MessageType::kStats;
  STRAIT_ASSIGN_OR_RETURN(Message reply, Call(m, deadline));
  if (reply.code != StatusCode::kOk) return Status(reply.code, reply.text);
  return std::string(reply.data.begin(), reply.data.end());
}

StatusOr<Message> Client::SendRawForTest(const std::vector<uint8_t>& bytes, Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return UnavailableError("connection to the gateway failed earlier; reconnect");
  Status s = WriteAll(fd_, bytes, deadline);
  if (!s.ok()) return s;
  auto body = ReadFrame(fd_, kDefaultMaxMessageBytes, deadline);
  if (!body.ok()) return body.status();
  return DecodeMessage(*body);
}

// ---- Tunnels ----------------------------------------------------------------------------------

namespace {

// A reply's tunnel id (connect) from its first 8 data bytes.
uint64_t TunnelIdOf(const Message& reply) {
  return GetLe(reply.data.data(), std::min<size_t>(8, reply.data.size()));
}

// The gateway answers an open at the deadline it was given; wait a moment longer for its reason.
Deadline WithMargin(Deadline deadline) {
  return deadline.IsInfinite() ? deadline
                               : Deadline::After(deadline.RemainingNanos() + 2'000'000'000);
}

}  // namespace

StatusOr<std::unique_ptr<TunnelConnection>> TunnelConnection::Connect(
    const std::string& socket_path, const std::string& region, uint32_t shard, uint64_t listen_id,
    Deadline deadline) {
  STRAIT_ASSIGN_OR_RETURN(int fd, Dial(socket_path, deadline, "tunnel-connect"));
  Message m;
  m.type = MessageType::kTunnelConnect;
  m.tunnel_region = region;
  m.tunnel_shard = shard;
  m.listen_id = listen_id;
  m.timeout_ms = TimeoutMs(deadline);
  Status s = WriteMessage(fd, m, deadline);
  StatusOr<Message> reply =
      s.ok() ? ReadReply(fd, MessageType::kTunnelConnect, WithMargin(deadline))
             : StatusOr<Message>(s);
  if (reply.ok() && reply->code != StatusCode::kOk) reply = Status(reply->code, reply->text);
  if (!reply.ok()) {
    ::close(fd);
    return reply.status().WithContext("tunnel to listen id " + std::to_string(listen_id) +
                                      " of region " + region);
  }
  return std::unique_ptr<TunnelConnection>(new TunnelConnection(fd, TunnelIdOf(*reply), region));
}

TunnelConnection::~TunnelConnection() {
  if (fd_ >= 0) ::close(fd_);
}

void TunnelConnection::Close() {
  // shutdown() rather than close(): the fd stays valid for a concurrent Send or Receive, which
  // then fail; the gateway reads end of file and closes the tunnel for the peer.
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Status TunnelConnection::Send(std::span<const uint8_t> data, uint32_t tag, Deadline deadline) {
  std::lock_guard<std::mutex> lock(send_mu_);
  if (send_broken_) return UnavailableError("tunnel connection failed earlier");
  Message m;
  m.type = MessageType::kTunnelData;
  m.tag = tag;
  m.data.assign(data.begin(), data.end());
  STRAIT_ASSIGN_OR_RETURN(std::vector<uint8_t> frame, EncodeMessage(m));
  Status s = WriteAll(fd_, frame, deadline);
  if (!s.ok()) {
    send_broken_ = true;
    return s.WithContext("tunnel send to region " + peer_region_);
  }
  return Status::Ok();
}

StatusOr<TunnelMessage> TunnelConnection::Receive(Deadline deadline) {
  std::lock_guard<std::mutex> lock(recv_mu_);
  if (has_ended_) return ended_;
  // Wait for the first byte only until the deadline, then read the whole frame (it is on its
  // way), so that a deadline never cuts a frame in half.
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    const int64_t left = deadline.RemainingNanos();
    if (left <= 0) return DeadlineExceededError("no tunnel message from region " + peer_region_);
    const int ms = static_cast<int>(std::min<int64_t>(left / 1'000'000 + 1, 1000));
    const int rc = ::poll(&p, 1, ms);
    if (rc > 0) break;
    if (rc < 0 && errno != EINTR) {
      return UnavailableError(std::string("poll: ") + std::strerror(errno));
    }
  }
  auto body = ReadFrame(fd_, kDefaultMaxMessageBytes, Deadline::AfterSeconds(60));
  StatusOr<Message> m = body.ok() ? DecodeMessage(*body) : StatusOr<Message>(body.status());
  if (m.ok() && m->type == MessageType::kTunnelData) {
    return TunnelMessage{m->tag, std::move(m->data)};
  }
  has_ended_ = true;
  if (!m.ok()) {
    ended_ = m.status().code() == StatusCode::kUnavailable
                 ? UnavailableError("the gateway closed the tunnel to region " + peer_region_ +
                                    " without a reason")
                 : m.status().WithContext("tunnel from region " + peer_region_);
  } else if (m->type != MessageType::kTunnelClose) {
    ended_ = InternalError(std::string("unexpected ") + MessageTypeName(m->type) +
                           " message on the tunnel from region " + peer_region_);
  } else if (m->code == StatusCode::kOk) {
    ended_ = OutOfRangeError("tunnel closed by the peer: " + m->text);
  } else {
    ended_ = Status(m->code, m->text);
  }
  return ended_;
}

StatusOr<std::unique_ptr<TunnelListener>> TunnelListener::Listen(const std::string& socket_path,
                                                                 Deadline deadline) {
  STRAIT_ASSIGN_OR_RETURN(int fd, Dial(socket_path, deadline, "tunnel-listen"));
  std::unique_ptr<TunnelListener> listener(new TunnelListener(socket_path, fd));
  Message m;
  m.type = MessageType::kTunnelListen;
  STRAIT_RETURN_IF_ERROR(WriteMessage(fd, m, deadline));
  STRAIT_ASSIGN_OR_RETURN(Message reply, ReadReply(fd, MessageType::kTunnelListen, deadline));
  if (reply.code != StatusCode::kOk) return Status(reply.code, reply.text);
  STRAIT_ASSIGN_OR_RETURN(TunnelEvent e, DecodeTunnelEvent(reply.data));
  if (e.kind != TunnelEventKind::kListening) {
    return InternalError("the gateway answered a listen with a tunnel event of kind " +
                         std::to_string(static_cast<int>(e.kind)));
  }
  listener->listen_id_ = e.id;
  listener->region_ = e.region;
  listener->shard_ = e.shard;
  return listener;
}

TunnelListener::~TunnelListener() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::unique_ptr<TunnelConnection>> TunnelListener::Accept(Deadline deadline) {
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    const int64_t left = deadline.RemainingNanos();
    if (left <= 0)
      return DeadlineExceededError("no incoming tunnel on listen id " + std::to_string(listen_id_));
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left / 1'000'000 + 1, 1000)));
    if (rc > 0) break;
    if (rc < 0 && errno != EINTR)
      return UnavailableError(std::string("poll: ") + std::strerror(errno));
  }
  STRAIT_ASSIGN_OR_RETURN(
      Message event, ReadReply(fd_, MessageType::kTunnelListen, Deadline::AfterSeconds(10)));
  if (event.code != StatusCode::kOk) return Status(event.code, event.text);
  STRAIT_ASSIGN_OR_RETURN(TunnelEvent e, DecodeTunnelEvent(event.data));
  if (e.kind != TunnelEventKind::kIncoming) {
    return InternalError("expected an incoming-tunnel event on the listen");
  }
  STRAIT_ASSIGN_OR_RETURN(int fd, Dial(socket_path_, deadline, "tunnel-accept"));
  Message m;
  m.type = MessageType::kTunnelAccept;
  m.tunnel_id = e.id;
  Status s = WriteMessage(fd, m, deadline);
  StatusOr<Message> reply =
      s.ok() ? ReadReply(fd, MessageType::kTunnelAccept, deadline) : StatusOr<Message>(s);
  if (reply.ok() && reply->code != StatusCode::kOk) reply = Status(reply->code, reply->text);
  if (!reply.ok()) {
    ::close(fd);
    return reply.status().WithContext("accepting tunnel " + std::to_string(e.id));
  }
  return std::unique_ptr<TunnelConnection>(new TunnelConnection(fd, e.id, e.region));
}

}  // namespace strait::localproto
