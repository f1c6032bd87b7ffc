// Shared memory between a rank and its straitd (the local protocol's kAttachShm and
// kAllReduceShm, protocol.h): the rank makes a sealed memfd, passes it once over the Unix socket
// (SCM_RIGHTS), and from then on sends only descriptors (offset, count) while the tensor stays
// in the shared pages, which straitd reduces in place. What crosses the socket per all-reduce is
// the request head and the reply head, not the tensor twice each way.
//
// Safety rules both sides keep (see "Shared memory" in protocol.h):
//  - The memfd is sealed against shrinking (F_SEAL_SHRINK) before it is passed: straitd maps it
//    only then, so a rank can never truncate the pages under the gateway (a SIGBUS there).
//  - A region belongs to the connection that attached it; a descriptor names an offset in that
//    region only, and one that does not lie inside it is refused before anything is touched.
//  - The mapping goes when the connection closes (a crashed rank's included): nothing is kept.
// Thread-compatible: one thread at a time per region.
#ifndef STRAIT_LIB_LOCALPROTO_SHM_H_
#define STRAIT_LIB_LOCALPROTO_SHM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "common/clock.h"
#include "localproto/protocol.h"
#include "strait/status.h"

namespace strait::localproto {

// Below this size an all-reduce goes through the socket: the descriptor round trip and the
// copy into the region save nothing on a few kilobytes.
inline constexpr size_t kShmMinBytes = 64 * 1024;

// A mapped memfd: made by the rank (Create) or received by the gateway (Adopt).
class ShmRegion {
 public:
  // A new anonymous region of `bytes` (1..kMaxShmBytes), sealed against shrinking and growing,
  // mapped read-write. kUnavailable when the kernel refuses (no memfd, out of memory).
  static StatusOr<std::unique_ptr<ShmRegion>> Create(size_t bytes);
  // Maps `fd` (taken over: closed by this call on failure too), announced as `bytes` long.
  // kInvalidArgument naming the reason when it is not a memfd sealed against shrinking, is
  // shorter than announced, or `bytes` is 0 or above kMaxShmBytes.
  static StatusOr<std::unique_ptr<ShmRegion>> Adopt(int fd, uint64_t bytes);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  int fd() const { return fd_; }
  size_t size() const { return size_; }
  uint8_t* data() const { return data_; }
  // The `bytes` at `offset`, or kInvalidArgument "... outside the shared region ..." when they
  // do not lie inside it (overflow-safe).
  StatusOr<std::span<uint8_t>> Slice(uint64_t offset, uint64_t bytes) const;

 private:
  ShmRegion(int fd, uint8_t* data, size_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Sends `fd` over the Unix socket `sock` as SCM_RIGHTS with one data byte (kAttachShm's second
// part). kUnavailable when the peer is gone, kDeadlineExceeded at the deadline.
Status SendFd(int sock, int fd, Deadline deadline);
// SendFd of 1..8 descriptors in one message (a peer must refuse more than one; tests send two).
Status SendFds(int sock, std::span<const int> fds, Deadline deadline);
// Receives the byte SendFd sends and the fd it carries, without waiting (the caller waited for
// the socket to be readable): the fd (close-on-exec, owned by the caller), -1 when nothing has
// arrived yet (EAGAIN: wait again), kInvalidArgument when the byte came without exactly one fd
// (any fds that came are closed), kUnavailable when the peer closed.
StatusOr<int> ReceiveFd(int sock);

}  // namespace strait::localproto

#endif  // STRAIT_LIB_LOCALPROTO_SHM_H_
