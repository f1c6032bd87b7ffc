// Reading and writing local-protocol frames (protocol.h) on a Unix socket, and dialling straitd:
// the blocking helpers every client of the protocol uses (Client, the NCCL plugin's CollNet).
//
// Every function blocks the calling thread until it is done or `deadline` passes; it works on
// blocking and non-blocking sockets alike (it polls before each transfer), and a shutdown() of the
// socket from another thread ends any wait at once (kUnavailable). Thread-safe on distinct fds.
#ifndef STRAIT_LIB_LOCALPROTO_FRAME_IO_H_
#define STRAIT_LIB_LOCALPROTO_FRAME_IO_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "localproto/protocol.h"
#include "strait/status.h"

namespace strait::localproto {

// Writes all of `bytes` to the socket by `deadline`. kDeadlineExceeded, or kUnavailable when the
// peer is gone.
Status WriteAll(int fd, std::span<const uint8_t> bytes, Deadline deadline);
// EncodeMessage(message) written with WriteAll: EncodeMessage's errors (nothing is written), or
// WriteAll's.
Status WriteMessage(int fd, const Message& message, Deadline deadline);
// Reads one frame's body by `deadline`. kUnavailable "connection closed" on a clean EOF before
// the first byte, kDataLoss on EOF mid-frame, kResourceExhausted when the length prefix exceeds
// `max_message_bytes` (nothing more is read), kInvalidArgument for a zero length.
StatusOr<std::vector<uint8_t>> ReadFrame(int fd, uint32_t max_message_bytes, Deadline deadline);
// ReadFrame into a reusable buffer: `*body` becomes the frame's body, its capacity kept, so that
// a connection serving many large frames does not allocate, zero and fault in a fresh buffer per
// frame (which glibc serves with mmap above 32 MiB: page faults and unmaps every time). Same
// errors as ReadFrame; on error `*body` is unspecified.
Status ReadFrameInto(int fd, uint32_t max_message_bytes, Deadline deadline,
                     std::vector<uint8_t>* body);
// Reading a frame in parts, so that its bulk data can go straight to where it belongs:
// ReadFrameLength reads the length prefix (errors as ReadFrame's, before the body), then
// ReadFrameBytes reads exactly out.size() bytes of the body (kDataLoss when the connection closes
// first, kDeadlineExceeded at the deadline). The caller must read the whole body, or drop the
// connection, before the next frame.
StatusOr<uint32_t> ReadFrameLength(int fd, uint32_t max_message_bytes, Deadline deadline);
Status ReadFrameBytes(int fd, std::span<uint8_t> out, Deadline deadline);

// Reads the head of one reply frame answering a request of type `expect`: the length prefix and
// every field before the data (type, reply type, code, text), and leaves the reply's data
// (*data_size bytes) unread, so that the caller reads it straight where it belongs (ReadFrameBytes)
// or skips the connection. The returned Message has its reply_to, code and text; its data is empty.
// kInternal for a frame that is not a reply to `expect` (the connection is out of step); the
// gateway's code and reason for an error reply to another type (it refused the request's framing
// and drops the connection); else the errors of ReadFrame and DecodeMessage.
StatusOr<Message> ReadReplyHead(int fd, MessageType expect, Deadline deadline, size_t* data_size);
// A whole reply frame answering `expect`, data included (ReadReplyHead's errors).
StatusOr<Message> ReadReply(int fd, MessageType expect, Deadline deadline);

// Connects to straitd's socket at `socket_path` and exchanges hellos (client name `client_name`);
// returns the connected fd, owned by the caller. With `wait_for_gateway`, a socket that is missing
// or refuses (a gateway starting up) is retried until the deadline. kUnavailable when nothing
// answers, kInvalidArgument for a path that does not fit a Unix socket address, the gateway's
// code (e.g. kPermissionDenied, kUnimplemented for another protocol version) when it refuses.
// `shard` (kAnyShard: none) goes in the hello: the shard this client uses (protocol.h).
StatusOr<int> Dial(const std::string& socket_path, Deadline deadline,
                   const std::string& client_name, bool wait_for_gateway = true,
                   uint32_t shard = kAnyShard);

}  // namespace strait::localproto

#endif  // STRAIT_LIB_LOCALPROTO_FRAME_IO_H_
