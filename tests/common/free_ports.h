// Test helper: loopback TCP ports the kernel just handed out, for tests that start straitd or
// plugin processes which must listen on a port known in advance (config files, handles).
#ifndef STRAIT_TESTS_COMMON_FREE_PORTS_H_
#define STRAIT_TESTS_COMMON_FREE_PORTS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace strait::test {

// `n` distinct ports on 127.0.0.1: all are held open at once, so the kernel cannot hand out one
// twice, then released for the caller's processes to bind (a port may in principle be taken by
// someone else in between; tests on this machine own the loopback ports they ask for).
inline std::vector<uint16_t> FreePorts(int n) {
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "cannot get a free loopback port";
    }
    if (fd >= 0) fds.push_back(fd);
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

}  // namespace strait::test

#endif  // STRAIT_TESTS_COMMON_FREE_PORTS_H_
