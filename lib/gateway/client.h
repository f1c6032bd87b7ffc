// The C++ client of straitd's local protocol, for any rank process (and the NCCL plugin).
//
// Usage:
//   auto client = Client::Connect("/run/strait/straitd.sock", Deadline::AfterSeconds(5));
//   auto policy = (*client)->RegisterJob("job-42", "int8,ef", Deadline::AfterSeconds(5));
//   Status s = (*client)->AllReduce("job-42", "layer3.grad", DataType::kFloat32, ReduceOp::kSum,
//                                   data, count, Deadline::AfterSeconds(60));
//
// Every call blocks the calling thread until the gateway answers or the deadline passes. One
// request is in flight per Client; calls from several threads are serialised by a mutex (use one
// Client per thread for concurrency). An error the gateway reports comes back with its code and
// message; a transport failure (gateway gone, deadline) leaves the connection unusable, and
// later calls fail with kUnavailable; connect again.
#ifndef STRAIT_LIB_GATEWAY_CLIENT_H_
#define STRAIT_LIB_GATEWAY_CLIENT_H_

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "common/clock.h"
#include "gateway/local_protocol.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::gateway {

class Client {
 public:
  // Connects to the gateway's socket and exchanges hellos. kUnavailable when nothing listens,
  // kPermissionDenied when the gateway refuses this process's credentials.
  static StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket_path,
                                                   Deadline deadline,
                                                   const std::string& client_name = "");
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Registers `job` with a policy string (see policy.h; "" = the gateway's default) and returns
  // the policy the gateway resolved, e.g. "int8+ef (...)". Registering again replaces it.
  StatusOr<std::string> RegisterJob(const std::string& job, const std::string& policy,
                                    Deadline deadline);

  // All-reduces `count` elements of `dtype` at `data` in place across the regions, under `job`'s
  // policy. Every region's ranks must issue the same (job, tensor key) sequence in the same
  // order. The gateway gives up at `deadline`; this call waits up to a moment longer (10%, at
  // least half a second) for the gateway's reason. On error `data` is unchanged.
  Status AllReduce(const std::string& job, const std::string& tensor_key, DataType dtype,
                   ReduceOp op, void* data, size_t count, Deadline deadline);

  // The gateway's counters as text.
  StatusOr<std::string> Stats(Deadline deadline);

  // Test hook: sends raw bytes (a frame or garbage) and reads one reply frame.
  StatusOr<Message> SendRawForTest(const std::vector<uint8_t>& bytes, Deadline deadline);

 private:
  explicit Client(int fd) : fd_(fd) {}
  StatusOr<Message> Call(const Message& request, Deadline deadline);
  StatusOr<Message> ReadReply(MessageType expect, Deadline deadline);

  std::mutex mu_;
  int fd_ = -1;
  bool broken_ = false;
};

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_CLIENT_H_
