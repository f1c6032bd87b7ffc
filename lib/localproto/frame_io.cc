// Frame I/O on the local socket (see frame_io.h).
#include "localproto/frame_io.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/endian.h"

namespace strait::localproto {
namespace {

// Waits for `events` on fd until the deadline: OK, or kDeadlineExceeded.
Status WaitFor(int fd, short events, Deadline deadline, const char* what) {
  for (;;) {
    const int64_t left = deadline.RemainingNanos();
    if (left <= 0) return DeadlineExceededError(std::string("local socket: timed out ") + what);
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min<int64_t>(left / 1'000'000 + 1, 1000));
    const int rc = ::poll(&p, 1, ms);
    if (rc > 0) return Status::Ok();
    if (rc < 0 && errno != EINTR) {
      return UnavailableError(std::string("local socket: poll failed: ") + std::strerror(errno));
    }
  }
}

// Reads exactly n bytes; *got says how many arrived before an error.
Status ReadExact(int fd, uint8_t* buf, size_t n, Deadline deadline, size_t* got) {
  *got = 0;
  while (*got < n) {
    STRAIT_RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline, "reading"));
    const ssize_t rc = ::recv(fd, buf + *got, n - *got, MSG_DONTWAIT);
    if (rc > 0) {
      *got += static_cast<size_t>(rc);
    } else if (rc == 0) {
      return UnavailableError("local socket: connection closed by the peer");
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return UnavailableError(std::string("local socket: read failed: ") + std::strerror(errno));
    }
  }
  return Status::Ok();
}

}  // namespace

Status WriteAll(int fd, std::span<const uint8_t> bytes, Deadline deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    STRAIT_RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, "writing"));
    const ssize_t rc =
        ::send(fd, bytes.data() + done, bytes.size() - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (rc > 0) {
      done += static_cast<size_t>(rc);
    } else if (rc < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return UnavailableError(std::string("local socket: write failed: ") + std::strerror(errno));
    }
  }
  return Status::Ok();
}

Status WriteMessage(int fd, const Message& message, Deadline deadline) {
  STRAIT_ASSIGN_OR_RETURN(std::vector<uint8_t> frame, EncodeMessage(message));
  return WriteAll(fd, frame, deadline);
}

StatusOr<uint32_t> ReadFrameLength(int fd, uint32_t max_message_bytes, Deadline deadline) {
  uint8_t len_bytes[kFrameLengthBytes];
  size_t got = 0;
  Status s = ReadExact(fd, len_bytes, sizeof(len_bytes), deadline, &got);
  if (!s.ok()) {
    if (got > 0 && s.code() == StatusCode::kUnavailable) {
      return DataLossError("local socket: connection closed inside a frame's length");
    }
    return s;
  }
  static_assert(kFrameLengthBytes == 4);
  const uint32_t len = GetU32(len_bytes);
  if (len == 0) return InvalidArgumentError("local frame with an empty body");
  if (len > max_message_bytes) {
    return ResourceExhaustedError("local frame of " + std::to_string(len) +
                                  " bytes exceeds the limit of " +
                                  std::to_string(max_message_bytes) + " bytes");
  }
  return len;
}

Status ReadFrameBytes(int fd, std::span<uint8_t> out, Deadline deadline) {
  size_t got = 0;
  Status s = ReadExact(fd, out.data(), out.size(), deadline, &got);
  if (!s.ok() && s.code() == StatusCode::kUnavailable) {
    return DataLossError("local socket: connection closed after " + std::to_string(got) +
                         " of " + std::to_string(out.size()) + " bytes of a frame");
  }
  return s;
}

Status ReadFrameInto(int fd, uint32_t max_message_bytes, Deadline deadline,
                     std::vector<uint8_t>* body) {
  STRAIT_ASSIGN_OR_RETURN(const uint32_t len, ReadFrameLength(fd, max_message_bytes, deadline));
  // Within the capacity, resize() neither allocates nor touches more than the growth.
  body->resize(len);
  return ReadFrameBytes(fd, *body, deadline);
}

StatusOr<std::vector<uint8_t>> ReadFrame(int fd, uint32_t max_message_bytes, Deadline deadline) {
  std::vector<uint8_t> body;
  STRAIT_RETURN_IF_ERROR(ReadFrameInto(fd, max_message_bytes, deadline, &body));
  return body;
}

namespace {

// A reply that does not answer `expect`. An error reply to another type is the gateway refusing
// the request's framing (it answers those as a hello, then drops the connection): its reason.
Status NotAReplyTo(MessageType expect, const Message& got) {
  if (got.type == MessageType::kReply && got.code != StatusCode::kOk) {
    return Status(got.code, "gateway refused the " + std::string(MessageTypeName(expect)) +
                                " request: " + got.text);
  }
  return InternalError(std::string("gateway answered a ") + MessageTypeName(expect) +
                       " request with a " + MessageTypeName(got.type) + " to " +
                       MessageTypeName(got.reply_to));
}

}  // namespace

StatusOr<Message> ReadReplyHead(int fd, MessageType expect, Deadline deadline, size_t* data_size) {
  STRAIT_ASSIGN_OR_RETURN(const uint32_t length,
                          ReadFrameLength(fd, kDefaultMaxMessageBytes, deadline));
  // The reply's head: type, reply type, code, text length (kReply's fixed fields), then the text;
  // the rest of the body is the data. A body too short for a head is decoded for its error.
  constexpr size_t kFixedHead = 1 + 1 + 4 + 2;
  std::vector<uint8_t> head(std::min<size_t>(length, kFixedHead));
  STRAIT_RETURN_IF_ERROR(ReadFrameBytes(fd, head, deadline));
  const size_t have = head.size();
  size_t head_size = length;  // not a reply's head: read it all; DecodeMessage says what is wrong
  if (have == kFixedHead && head[0] == static_cast<uint8_t>(MessageType::kReply)) {
    head_size = std::min<size_t>(length, kFixedHead + size_t{GetU16(head.data() + 6)});
  }
  head.resize(head_size);
  STRAIT_RETURN_IF_ERROR(ReadFrameBytes(fd, std::span<uint8_t>(head).subspan(have), deadline));
  auto reply = DecodeMessage(head);
  if (!reply.ok()) return reply.status().WithContext("bad reply from the gateway");
  if (reply->type != MessageType::kReply || reply->reply_to != expect) {
    return NotAReplyTo(expect, *reply);
  }
  *data_size = length - head_size;
  return reply;
}

StatusOr<Message> ReadReply(int fd, MessageType expect, Deadline deadline) {
  STRAIT_ASSIGN_OR_RETURN(std::vector<uint8_t> body,
                          ReadFrame(fd, kDefaultMaxMessageBytes, deadline));
  auto reply = DecodeMessage(body);
  if (!reply.ok()) return reply.status().WithContext("bad reply from the gateway");
  if (reply->type != MessageType::kReply || reply->reply_to != expect) {
    return NotAReplyTo(expect, *reply);
  }
  return reply;
}

StatusOr<int> Dial(const std::string& socket_path, Deadline deadline,
                   const std::string& client_name, bool wait_for_gateway, uint32_t shard) {
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
      Message hello;
      hello.type = MessageType::kHello;
      hello.client_name = client_name;
      hello.client_shard = shard;
      Status s = WriteMessage(fd, hello, deadline);
      StatusOr<Message> reply =
          s.ok() ? ReadReply(fd, MessageType::kHello, deadline) : StatusOr<Message>(s);
      if (!reply.ok()) {
        ::close(fd);
        return reply.status().WithContext("gateway at " + socket_path);
      }
      if (reply->code != StatusCode::kOk) {
        ::close(fd);
        return Status(reply->code, "gateway at " + socket_path + ": " + reply->text);
      }
      return fd;
    }
    const int err = errno;
    ::close(fd);
    // The gateway may be starting: retry a missing or refusing socket until the deadline.
    if (!wait_for_gateway || (err != ENOENT && err != ECONNREFUSED && err != EAGAIN) ||
        deadline.Expired()) {
      return UnavailableError("cannot connect to the gateway at " + socket_path + ": " +
                              std::strerror(err) + " (is straitd running?)");
    }
    ::usleep(20'000);
  }
}

}  // namespace strait::localproto
