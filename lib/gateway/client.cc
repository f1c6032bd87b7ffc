// The local-protocol client (see client.h).
#include "gateway/client.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace strait::gateway {

StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path,
                                                  Deadline deadline,
                                                  const std::string& client_name) {
  sockaddr_un addr{};
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgumentError("gateway socket path \"" + socket_path + "\" must be 1-" +
                                std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  for (;;) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return UnavailableError(std::string("socket(): ") + std::strerror(errno));
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      std::unique_ptr<Client> client(new Client(fd));  // private constructor
      Message hello;
      hello.type = MessageType::kHello;
      hello.client_name = client_name;
      auto reply = client->Call(hello, deadline);
      if (!reply.ok()) return reply.status().WithContext("gateway at " + socket_path);
      if (reply->code != StatusCode::kOk) {
        return Status(reply->code, "gateway at " + socket_path + ": " + reply->text);
      }
      return client;
    }
    const int err = errno;
    ::close(fd);
    // The gateway may be starting: retry a missing or refusing socket until the deadline.
    if ((err != ENOENT && err != ECONNREFUSED && err != EAGAIN) || deadline.Expired()) {
      return UnavailableError("cannot connect to the gateway at " + socket_path + ": " +
                              std::strerror(err) + " (is straitd running?)");
    }
    ::usleep(20'000);
  }
}

Client::~Client() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<Message> Client::ReadReply(MessageType expect, Deadline deadline) {
  auto body = ReadFrame(fd_, kDefaultMaxMessageBytes, deadline);
  if (!body.ok()) {
    broken_ = true;
    return body.status();
  }
  auto reply = DecodeMessage(*body);
  if (!reply.ok()) {
    broken_ = true;
    return reply.status().WithContext("bad reply from the gateway");
  }
  if (reply->type != MessageType::kReply || reply->reply_to != expect) {
    broken_ = true;
    return InternalError(std::string("gateway answered a ") + MessageTypeName(expect) +
                         " request with a " + MessageTypeName(reply->type) + " to " +
                         MessageTypeName(reply->reply_to));
  }
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

Status Client::AllReduce(const std::string& job, const std::string& tensor_key, DataType dtype,
                         ReduceOp op, void* data, size_t count, Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t elem = DataTypeSize(dtype);
  if (elem == 0) return InvalidArgumentError("all-reduce: invalid dtype");
  if (count > 0 && data == nullptr) return InvalidArgumentError("all-reduce: data is null");
  Message m;
  m.type = MessageType::kAllReduce;
  m.job = job;
  m.tensor_key = tensor_key;
  m.dtype = dtype;
  m.op = op;
  m.count = count;
  const int64_t left_ms = deadline.RemainingNanos() / 1'000'000;
  m.timeout_ms = deadline.IsInfinite() ? 0 : static_cast<uint32_t>(std::max<int64_t>(1, left_ms));
  const auto* bytes = static_cast<const uint8_t*>(data);
  m.data.assign(bytes, bytes + count * elem);
  // The gateway gives up at `deadline`; wait a moment longer for its answer, which says which
  // peer or phase was late, rather than reporting a bare local timeout.
  const Deadline reply_by =
      deadline.IsInfinite()
          ? deadline
          : Deadline::After(deadline.RemainingNanos() +
                            std::max<int64_t>(500'000'000, deadline.RemainingNanos() / 10));
  STRAIT_ASSIGN_OR_RETURN(Message reply, Call(m, reply_by));
  if (reply.code != StatusCode::kOk) return Status(reply.code, reply.text);
  if (reply.data.size() != count * elem) {
    broken_ = true;
    return InternalError("gateway returned " + std::to_string(reply.data.size()) +
                         " bytes for an all-reduce of " + std::to_string(count * elem));
  }
  if (count > 0) std::memcpy(data, reply.data.data(), reply.data.size());
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

}  // namespace strait::gateway
