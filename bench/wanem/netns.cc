// Namespace creation and removal, TUN devices and per-namespace settings (see netns.h).
#include "bench/wanem/netns.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/ethtool.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <sched.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/log.h"

extern char** environ;

namespace strait::wanem {
namespace {

std::string Errno(std::string_view what) {
  return std::string(what) + ": " + std::strerror(errno);
}

Status SetFlagsUp(int sock, const char* dev) {
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, dev, IFNAMSIZ - 1);
  if (ioctl(sock, SIOCGIFFLAGS, &ifr) < 0) return InternalError(Errno("SIOCGIFFLAGS " +
                                                                        std::string(dev)));
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
  if (ioctl(sock, SIOCSIFFLAGS, &ifr) < 0) return InternalError(Errno("SIOCSIFFLAGS " +
                                                                        std::string(dev)));
  return Status::Ok();
}

Status SetOffload(int sock, const char* dev, uint32_t cmd, const char* what) {
  ethtool_value ev{};
  ev.cmd = cmd;
  ev.data = 0;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, dev, IFNAMSIZ - 1);
  ifr.ifr_data = reinterpret_cast<char*>(&ev);
  if (ioctl(sock, SIOCETHTOOL, &ifr) < 0 && errno != EOPNOTSUPP) {
    return InternalError(Errno(std::string("turning ") + what + " off on " + dev));
  }
  return Status::Ok();
}

}  // namespace

void UniqueFd::Reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Status CheckPrivileges() {
  if (geteuid() != 0) {
    return PermissionDeniedError("strait-wanem needs root (network namespaces and TUN devices); "
                                 "run it with sudo");
  }
  if (access("/dev/net/tun", R_OK | W_OK) != 0) {
    return FailedPreconditionError("/dev/net/tun is missing or not accessible (" +
                                   std::string(std::strerror(errno)) +
                                   "); load the tun module or run in a container with it");
  }
  if (access("/proc/self/ns/net", R_OK) != 0) {
    return FailedPreconditionError("this kernel has no network namespaces (/proc/self/ns/net)");
  }
  Status ip = RunCommand({"ip", "-V"});
  if (!ip.ok()) return FailedPreconditionError("iproute2's `ip` is required: " + ip.message());
  return Status::Ok();
}

Status ValidateInstanceName(std::string_view name) {
  bool ok = !name.empty() && name.size() <= 16;
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
  }
  if (!ok) {
    return InvalidArgumentError("bad --name '" + std::string(name) +
                                "': use 1-16 characters of a-z, 0-9 and _");
  }
  return Status::Ok();
}

std::string NamespacePrefix(std::string_view instance) {
  return std::string(kNsPrefix) + std::string(instance) + "-r";
}

std::string NamespaceName(std::string_view instance, int region) {
  return NamespacePrefix(instance) + std::to_string(region);
}

std::string RegionAddress(int region) { return "10.201." + std::to_string(region) + ".1"; }

uint32_t RegionAddressBe(int region) {
  return htonl((10u << 24) | (201u << 16) | (static_cast<uint32_t>(region) << 8) | 1u);
}

std::vector<std::string> ListNamespaces(std::string_view prefix) {
  std::vector<std::string> out;
  DIR* d = opendir(kNetnsDir);
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string_view n = e->d_name;
    if (n.substr(0, prefix.size()) == prefix) out.emplace_back(n);
  }
  closedir(d);
  return out;
}

Status RunCommand(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return InternalError(Errno("pipe2"));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The caller may block signals for its own signalfd handling; the child must not inherit that.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(pipefd[1]);
  UniqueFd out(pipefd[0]);
  std::string cmdline;
  for (const auto& a : argv) cmdline += (cmdline.empty() ? "" : " ") + a;
  if (rc != 0) {
    return FailedPreconditionError("cannot run `" + cmdline + "`: " + std::strerror(rc));
  }
  std::string text;
  char buf[512];
  while (true) {
    const ssize_t n = ::read(out.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (text.size() < 4096) text.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return InternalError("`" + cmdline + "` failed (status " + std::to_string(status) +
                       "): " + text);
}

Status CreateNamespace(const std::string& ns) {
  if (ns.rfind(kNsPrefix, 0) != 0) {
    return InvalidArgumentError("refusing to create namespace '" + ns + "' without the " +
                                kNsPrefix + " prefix");
  }
  return RunCommand({"ip", "netns", "add", ns});
}

Status DeleteNamespace(const std::string& ns) {
  if (ns.rfind(kNsPrefix, 0) != 0 || ns.find('/') != std::string::npos) {
    return InvalidArgumentError("refusing to delete namespace '" + ns + "'");
  }
  const std::string path = std::string(kNetnsDir) + "/" + ns;
  if (umount2(path.c_str(), MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT) {
    return InternalError(Errno("umount " + path));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return InternalError(Errno("unlink " + path));
  return Status::Ok();
}

NetnsGuard::~NetnsGuard() { Leave().IgnoreError(); }

StatusOr<NetnsGuard> NetnsGuard::Enter(const std::string& ns) {
  NetnsGuard g;
  g.original_.Reset(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!g.original_.valid()) return InternalError(Errno("open /proc/thread-self/ns/net"));
  const std::string path = std::string(kNetnsDir) + "/" + ns;
  UniqueFd target(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!target.valid()) return NotFoundError(Errno("network namespace " + path));
  if (setns(target.get(), CLONE_NEWNET) != 0) return InternalError(Errno("setns " + path));
  return g;
}

Status NetnsGuard::Leave() {
  if (!original_.valid()) return Status::Ok();
  const int rc = setns(original_.get(), CLONE_NEWNET);
  original_.Reset();
  if (rc != 0) return InternalError(Errno("setns back to the original namespace"));
  return Status::Ok();
}

Status WriteSysctl(const std::string& key, const std::string& value) {
  const std::string path = "/proc/sys/" + key;
  std::ofstream f(path);
  f << value;
  f.flush();
  if (!f) return InternalError("cannot write '" + value + "' to " + path);
  return Status::Ok();
}

StatusOr<std::string> ReadSysctl(const std::string& key) {
  std::ifstream f("/proc/sys/" + key);
  if (!f) return NotFoundError("cannot read /proc/sys/" + key);
  std::string s;
  std::getline(f, s);
  return s;
}

StatusOr<bool> ReadOffload(const std::string& dev, uint32_t cmd) {
  UniqueFd sock(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return InternalError(Errno("socket"));
  ethtool_value ev{};
  ev.cmd = cmd;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, dev.c_str(), IFNAMSIZ - 1);
  ifr.ifr_data = reinterpret_cast<char*>(&ev);
  if (ioctl(sock.get(), SIOCETHTOOL, &ifr) < 0) return InternalError(Errno("SIOCETHTOOL"));
  return ev.data != 0;
}

StatusOr<UniqueFd> SetUpRegion(const RegionSetup& setup) {
  if (setup.mtu < 576 || setup.mtu > 65535) {
    return InvalidArgumentError("bad --mtu " + std::to_string(setup.mtu) + ": must be 576..65535");
  }
  STRAIT_ASSIGN_OR_RETURN(NetnsGuard guard, NetnsGuard::Enter(setup.ns));

  // IPv6 off first, so the device never sends router solicitations into the emulator.
  WriteSysctl("net/ipv6/conf/all/disable_ipv6", "1").IgnoreError();
  WriteSysctl("net/ipv6/conf/default/disable_ipv6", "1").IgnoreError();
  const std::string max = std::to_string(setup.tcp_buffer_max);
  STRAIT_RETURN_IF_ERROR(WriteSysctl("net/ipv4/tcp_rmem", "4096 131072 " + max));
  STRAIT_RETURN_IF_ERROR(WriteSysctl("net/ipv4/tcp_wmem", "4096 16384 " + max));
  // A cached ssthresh from an earlier flow would make runs depend on their order.
  WriteSysctl("net/ipv4/tcp_no_metrics_save", "1").IgnoreError();
  // Emulated hosts are tuned as deploy/README.md asks of gateway hosts: without this, a stream
  // silent for one RTO (a compute phase) restarts in slow start.
  WriteSysctl("net/ipv4/tcp_slow_start_after_idle", "0").IgnoreError();
  auto avail = ReadSysctl("net/ipv4/tcp_available_congestion_control");
  if (avail.ok() && (" " + *avail + " ").find(" " + setup.cc + " ") == std::string::npos) {
    return InvalidArgumentError("bad --cc '" + setup.cc + "': this kernel offers " + *avail);
  }
  Status cc = WriteSysctl("net/ipv4/tcp_congestion_control", setup.cc);
  if (!cc.ok()) {
    // Only the root namespace may make a "restricted" algorithm the default; the list of the
    // unrestricted ones is global, and strait-wanem does not change the root namespace.
    auto allowed = ReadSysctl("net/ipv4/tcp_allowed_congestion_control");
    return InvalidArgumentError(
        "bad --cc '" + setup.cc + "': a namespace may only default to an algorithm in "
        "net.ipv4.tcp_allowed_congestion_control of the root namespace ('" +
        allowed.value_or(std::string("?")) + "'); add it there yourself, or pick one of those "
        "(programs can still choose it per socket with TCP_CONGESTION)");
  }

  // The TUN device is created in the namespace of the thread that opens /dev/net/tun.
  UniqueFd tun(::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (!tun.valid()) return InternalError(Errno("open /dev/net/tun"));
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::strncpy(ifr.ifr_name, kTunName, IFNAMSIZ - 1);
  if (ioctl(tun.get(), TUNSETIFF, &ifr) < 0) return InternalError(Errno("TUNSETIFF"));

  UniqueFd sock(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return InternalError(Errno("socket"));
  STRAIT_RETURN_IF_ERROR(SetFlagsUp(sock.get(), "lo"));
  // Without IFF_VNET_HDR a TUN device cannot take TSO, so the stack's software GSO segments
  // every large send before the driver: each read of the router is one wire packet of at most
  // the MTU (the router counts the largest it saw; the tests check it), and one lost packet is
  // one packet. Software GSO is kept on by default because segmenting once per 64 KiB instead
  // of per packet in TCP is what lets two cores reach 1 Gbit/s at MTU 1500; --no-gso turns it
  // off. GRO off: each written packet is delivered alone.
  STRAIT_RETURN_IF_ERROR(SetOffload(sock.get(), kTunName, ETHTOOL_STSO, "TSO"));
  if (!setup.gso) STRAIT_RETURN_IF_ERROR(SetOffload(sock.get(), kTunName, ETHTOOL_SGSO, "GSO"));
  STRAIT_RETURN_IF_ERROR(SetOffload(sock.get(), kTunName, ETHTOOL_SGRO, "GRO"));

  ifreq req{};
  std::strncpy(req.ifr_name, kTunName, IFNAMSIZ - 1);
  req.ifr_mtu = setup.mtu;
  if (ioctl(sock.get(), SIOCSIFMTU, &req) < 0) return InternalError(Errno("SIOCSIFMTU"));
  // The TUN queue drops when full; a long one keeps router hiccups from becoming losses the
  // emulation did not ask for.
  req.ifr_qlen = 10000;
  if (ioctl(sock.get(), SIOCSIFTXQLEN, &req) < 0) return InternalError(Errno("SIOCSIFTXQLEN"));

  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = RegionAddressBe(setup.region);
  std::memcpy(&req.ifr_addr, &addr, sizeof(addr));
  if (ioctl(sock.get(), SIOCSIFADDR, &req) < 0) return InternalError(Errno("SIOCSIFADDR"));
  addr.sin_addr.s_addr = htonl(0xffff0000u);
  std::memcpy(&req.ifr_netmask, &addr, sizeof(addr));
  if (ioctl(sock.get(), SIOCSIFNETMASK, &req) < 0) return InternalError(Errno("SIOCSIFNETMASK"));
  STRAIT_RETURN_IF_ERROR(SetFlagsUp(sock.get(), kTunName));
  STRAIT_RETURN_IF_ERROR(guard.Leave());
  return tun;
}

}  // namespace strait::wanem
