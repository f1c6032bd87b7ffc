// CollNet's use of the local wire: a blocking connection to the node's straitd speaking the local
// protocol (lib/localproto/protocol.h) for the few requests CollNet makes: register-job, a tunnel
// listen to learn the region and shard, join-job, and region all-reduce with its bulk data.
// Internal to collnet.cc, whose worker threads own one connection per slot.
//
// Threading: one thread at a time per connection, except Shutdown (any thread). Blocks: every
// call waits for straitd, bounded by the deadline passed in.
#ifndef STRAIT_PLUGINS_NCCL_COLLNET_GATEWAY_H_
#define STRAIT_PLUGINS_NCCL_COLLNET_GATEWAY_H_

#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/endian.h"
#include "localproto/frame_io.h"
#include "localproto/protocol.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::nccl {


// A blocking connection to the local straitd: localproto's frame I/O, where every wait is bounded
// by a deadline and Shutdown() from another thread ends any wait at once.
class GatewayConnection {
 public:
  using Message = localproto::Message;
  using MessageType = localproto::MessageType;

  static StatusOr<std::unique_ptr<GatewayConnection>> Open(const std::string& path,
                                                           Deadline deadline) {
    // No waiting for a gateway that is not there: NCCL falls back to its own all-reduce at once.
    StatusOr<int> fd = localproto::Dial(path, deadline, "nccl-collnet", /*wait_for_gateway=*/false);
    if (!fd.ok()) {
      if (fd.status().code() != StatusCode::kUnavailable) return fd.status();
      return UnavailableError("cannot reach straitd at STRAIT_GATEWAY=\"" + path +
                              "\": " + fd.status().message() +
                              "; start the node's straitd or fix STRAIT_GATEWAY");
    }
    return std::unique_ptr<GatewayConnection>(new GatewayConnection(*fd, path));
  }

  ~GatewayConnection() { ::close(fd_); }
  GatewayConnection(const GatewayConnection&) = delete;
  GatewayConnection& operator=(const GatewayConnection&) = delete;

  // Wakes every wait of this connection (they fail); the fd stays open until destruction.
  void Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

  // Returns the policy the gateway resolved.
  StatusOr<std::string> RegisterJob(const std::string& job, const std::string& policy,
                                    Deadline deadline) {
    Message m = Request(MessageType::kRegisterJob);
    m.job = job;
    m.policy = policy;
    STRAIT_ASSIGN_OR_RETURN(Message reply, Call(m, deadline));
    return reply.text;
  }

  // Which region and shard index the gateway serves, from a tunnel listen's kListening event
  // (the documented way to learn them). The connection belongs to the listen afterwards: close it.
  Status ProbeRegionAndShard(Deadline deadline, std::string* region, uint32_t* shard) {
    STRAIT_ASSIGN_OR_RETURN(Message reply, Call(Request(MessageType::kTunnelListen), deadline));
    StatusOr<localproto::TunnelEvent> event = localproto::DecodeTunnelEvent(reply.data);
    if (!event.ok() || event->kind != localproto::TunnelEventKind::kListening) {
      const std::string why = event.ok() ? std::string() : ": " + event.status().ToString();
      return DataLossError("straitd at " + path_ +
                           " answered the tunnel listen with an event that is not a listening "
                           "event" + why);
    }
    *shard = event->shard;
    *region = event->region;
    return Status::Ok();
  }

  // Joins the next generation of (job, scope) with the other regions' gateways (kJoinJob):
  // the comm's operations are numbered within it.
  StatusOr<uint64_t> JoinJob(const std::string& job, uint64_t scope, uint32_t timeout_ms,
                             Deadline deadline) {
    Message m = Request(MessageType::kJoinJob);
    m.job = job;
    m.scope = scope;
    m.timeout_ms = timeout_ms;
    m.resume = 0;  // unknown (NCCL does not tell the plugin which steps it completed)
    STRAIT_ASSIGN_OR_RETURN(Message reply, Call(m, deadline));
    if (reply.data.size() != 8 || GetLe(reply.data.data(), 8) == 0) {
      return DataLossError("straitd at " + path_ + " answered join-job without a generation");
    }
    return GetLe(reply.data.data(), 8);
  }

  // The identity of one region all-reduce (localproto/protocol.h, "Operation identity").
  struct Identity {
    uint64_t generation = 0;
    uint64_t sequence = 0;
    uint64_t scope = 0;
  };

  // One region all-reduce: `count` elements from `send` into `recv` (may be the same buffer).
  // The tensor goes out straight from `send` and the result comes back straight into `recv`.
  Status RegionAllReduce(const std::string& job, const std::string& key, DataType dtype,
                         ReduceOp op, const void* send, void* recv, size_t count,
                         uint32_t timeout_ms, const Identity& id, Deadline deadline) {
    const size_t bytes = count * DataTypeSize(dtype);
    Message m = Request(MessageType::kRegionAllReduce);
    m.job = job;
    m.tensor_key = key;
    m.dtype = dtype;
    m.op = op;
    m.count = count;
    m.timeout_ms = timeout_ms;
    m.generation = id.generation;
    m.sequence = id.sequence;
    m.scope = id.scope;
    StatusOr<std::vector<uint8_t>> head = localproto::EncodeMessageHead(m, bytes);
    if (!head.ok()) return head.status();
    Status s = localproto::WriteAll(fd_, *head, deadline);
    if (s.ok() && bytes > 0) {
      s = localproto::WriteAll(fd_, std::span(static_cast<const uint8_t*>(send), bytes), deadline);
    }
    if (!s.ok()) return Lost(s);
    size_t data_size = 0;
    StatusOr<Message> reply = localproto::ReadReplyHead(fd_, m.type, deadline, &data_size);
    if (!reply.ok()) return Lost(reply.status());
    if (reply->code == StatusCode::kOk && data_size != bytes) {
      return DataLossError("straitd at " + path_ + " returned " + std::to_string(data_size) +
                           " bytes for a " + std::to_string(bytes) + "-byte all-reduce");
    }
    if (reply->code != StatusCode::kOk && data_size > localproto::kMaxControlBodyBytes) {
      return DataLossError("straitd at " + path_ + " sent an error reply with " +
                           std::to_string(data_size) + " data bytes");
    }
    // An error reply's data (the refusal marker) is read and dropped: the step failed either way.
    std::vector<uint8_t> dropped(reply->code == StatusCode::kOk ? 0 : data_size);
    const std::span<uint8_t> into = reply->code == StatusCode::kOk
                                        ? std::span(static_cast<uint8_t*>(recv), bytes)
                                        : std::span<uint8_t>(dropped);
    if (Status r = localproto::ReadFrameBytes(fd_, into, deadline); !r.ok()) return Lost(r);
    return Answer(*reply);
  }

 private:
  GatewayConnection(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  static Message Request(MessageType type) {
    Message m;
    m.type = type;
    return m;
  }

  Status Lost(const Status& why) const {
    return why.WithContext("connection to straitd at " + path_);
  }

  // The gateway's answer as a Status (its code and message).
  Status Answer(const Message& reply) const {
    if (reply.code == StatusCode::kOk) return Status::Ok();
    return Status(reply.code, "straitd at " + path_ + ": " + reply.text);
  }

  // One request without bulk data and its whole reply; the gateway's error as the Status.
  StatusOr<Message> Call(const Message& request, Deadline deadline) {
    if (Status s = localproto::WriteMessage(fd_, request, deadline); !s.ok()) return Lost(s);
    StatusOr<Message> reply = localproto::ReadReply(fd_, request.type, deadline);
    if (!reply.ok()) return Lost(reply.status());
    STRAIT_RETURN_IF_ERROR(Answer(*reply));
    return reply;
  }

  const int fd_;
  const std::string path_;
};

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_COLLNET_GATEWAY_H_
