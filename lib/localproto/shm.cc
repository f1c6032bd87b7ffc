// Shared-memory regions and passing their memfd over a Unix socket (see shm.h).
#include "localproto/shm.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace strait::localproto {
namespace {

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Create(size_t bytes) {
  if (bytes == 0 || bytes > kMaxShmBytes) {
    return InvalidArgumentError("shared region of " + std::to_string(bytes) +
                                " bytes; allowed 1.." + std::to_string(kMaxShmBytes));
  }
  const int fd = ::memfd_create("strait-local", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return UnavailableError(Errno("memfd_create"));
  auto fail = [fd](const char* what) {
    Status s = UnavailableError(Errno(what));
    ::close(fd);
    return s;
  };
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail("ftruncate of the memfd");
  // Sealed before it leaves this process: the gateway maps only regions that cannot shrink.
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail("sealing the memfd");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap of the memfd");
  return std::unique_ptr<ShmRegion>(new ShmRegion(fd, static_cast<uint8_t*>(p), bytes));
}

StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Adopt(int fd, uint64_t bytes) {
  auto refuse = [fd](std::string why) {
    ::close(fd);
    return InvalidArgumentError("attach-shm: " + why);
  };
  if (bytes == 0 || bytes > kMaxShmBytes) {
    return refuse("a region of " + std::to_string(bytes) + " bytes; allowed 1.." +
                  std::to_string(kMaxShmBytes));
  }
  // F_GET_SEALS fails (EINVAL) on anything but a memfd: files, pipes, sockets are refused.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return refuse("the descriptor passed is not a memfd (" + std::string(std::strerror(errno)) +
                  "); pass one made with memfd_create(MFD_ALLOW_SEALING)");
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return refuse("the memfd is not sealed against shrinking; add F_SEAL_SHRINK before "
                  "passing it (a region that can shrink could fault the gateway)");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return refuse(Errno("fstat"));
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return refuse("the memfd holds " + std::to_string(st.st_size) + " bytes, fewer than the " +
                  std::to_string(bytes) + " announced");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return refuse(Errno("mmap"));
  return std::unique_ptr<ShmRegion>(
      new ShmRegion(fd, static_cast<uint8_t*>(p), static_cast<size_t>(bytes)));
}

ShmRegion::~ShmRegion() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::span<uint8_t>> ShmRegion::Slice(uint64_t offset, uint64_t bytes) const {
  if (offset > size_ || bytes > size_ - offset) {
    return InvalidArgumentError("descriptor of " + std::to_string(bytes) + " bytes at offset " +
                                std::to_string(offset) + " lies outside the shared region of " +
                                std::to_string(size_) +
                                " bytes; attach a region large enough for the tensor");
  }
  return std::span<uint8_t>(data_ + offset, static_cast<size_t>(bytes));
}

Status SendFd(int sock, int fd, Deadline deadline) {
  return SendFds(sock, std::span<const int>(&fd, 1), deadline);
}

Status SendFds(int sock, std::span<const int> fds, Deadline deadline) {
  constexpr size_t kMaxFds = 8;
  if (fds.empty() || fds.size() > kMaxFds) {
    return InvalidArgumentError("passing " + std::to_string(fds.size()) +
                                " descriptors; allowed 1.." + std::to_string(kMaxFds));
  }
  uint8_t byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  for (;;) {
    const ssize_t rc = ::sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (rc == 1) return Status::Ok();
    if (rc < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return UnavailableError(Errno("local socket: passing the memfd"));
    }
    const int64_t left = deadline.RemainingNanos();
    if (left <= 0) return DeadlineExceededError("local socket: timed out passing the memfd");
    pollfd p{sock, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left / 1'000'000 + 1, 1000)));
  }
}

StatusOr<int> ReceiveFd(int sock) {
  uint8_t byte = 0;
  iovec iov{&byte, 1};
  // Room for more than one fd, so that a client passing several is told rather than having
  // the kernel truncate (MSG_CTRUNC) and leak them into this process unnoticed.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t rc;
  do {
    rc = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
  if (rc < 0) return UnavailableError(Errno("local socket: receiving the memfd"));
  if (rc == 0) return UnavailableError("local socket: connection closed before the memfd came");
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.push_back(f);
    }
  }
  if (fds.size() == 1 && (msg.msg_flags & MSG_CTRUNC) == 0) return fds[0];
  for (const int f : fds) ::close(f);
  return InvalidArgumentError(
      "attach-shm: the byte after the request carried " + std::to_string(fds.size()) +
      " descriptors" + ((msg.msg_flags & MSG_CTRUNC) != 0 ? " (and more, cut off)" : "") +
      "; send exactly one memfd with it (SCM_RIGHTS)");
}

}  // namespace strait::localproto
