// Network-namespace plumbing for strait-wanem: naming, creation and removal of the per-region
// namespaces, entering one from a thread, creating a region's TUN device and configuring it.
//
// Safety: everything here acts inside namespaces named `strait-<instance>-r<i>` (kNsPrefix) under
// /run/netns. Nothing adds an address, route, device or sysctl to the namespace the process
// started in; the only global file written is the instance's pid file under /run/strait-wanem.
// Regions use 10.201.<region>.1/16 inside their own namespace only.
#ifndef STRAIT_BENCH_WANEM_NETNS_H_
#define STRAIT_BENCH_WANEM_NETNS_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strait/status.h"

namespace strait::wanem {

inline constexpr const char* kNsPrefix = "strait-";
inline constexpr const char* kNetnsDir = "/run/netns";
inline constexpr const char* kStateDir = "/run/strait-wanem";
inline constexpr const char* kTunName = "wan0";

// Owns a file descriptor.
class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }
  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  void Reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

// OK when this process can build an emulation (root, /dev/net/tun, `ip`); otherwise an error
// that says what is missing (tests print it when they skip).
Status CheckPrivileges();

// Instance names: 1-16 of [a-z0-9_], so that namespace names stay short and greppable.
Status ValidateInstanceName(std::string_view name);
std::string NamespaceName(std::string_view instance, int region);  // strait-<instance>-r<i>
std::string NamespacePrefix(std::string_view instance);            // strait-<instance>-r
// "10.201.<region>.1": the region's address, inside its namespace only.
std::string RegionAddress(int region);
uint32_t RegionAddressBe(int region);  // network byte order

// Names under /run/netns starting with `prefix`.
std::vector<std::string> ListNamespaces(std::string_view prefix);
// `ip netns add <ns>`.
Status CreateNamespace(const std::string& ns);
// Unmounts and removes /run/netns/<ns> (what `ip netns del` does). The namespace itself goes
// once no process or open descriptor holds it.
Status DeleteNamespace(const std::string& ns);

// Runs argv (searched on PATH) and waits; the error carries its exit status and stderr.
Status RunCommand(const std::vector<std::string>& argv);

// Moves the calling thread into namespace `ns` and back on destruction (or Leave()).
class NetnsGuard {
 public:
  static StatusOr<NetnsGuard> Enter(const std::string& ns);
  NetnsGuard(NetnsGuard&&) noexcept = default;
  NetnsGuard& operator=(NetnsGuard&&) noexcept = default;
  ~NetnsGuard();
  Status Leave();

 private:
  NetnsGuard() = default;
  UniqueFd original_;
};

// What a region's namespace gets: sysctls, loopback up, the TUN device with its address.
struct RegionSetup {
  std::string ns;
  int region = 0;
  int mtu = 1500;
  std::string cc = "bbr";
  bool gso = true;  // Software GSO (see SetUpRegion); TSO is never available on TUN.
  // tcp_rmem / tcp_wmem maxima: 1 Gbit/s x 200 ms is 25 MB; TCP autotuning wants about twice
  // the BDP of receive buffer, so 64 MiB.
  uint64_t tcp_buffer_max = 64ull << 20;
};

// Enters the namespace, writes its sysctls, creates and configures the TUN device (IFF_TUN,
// IFF_NO_PI, TSO and GRO off, GSO as asked, MTU, txqueuelen, address 10.201.<region>.1/16, up) and returns
// the device's non-blocking descriptor, held in the caller's namespace.
StatusOr<UniqueFd> SetUpRegion(const RegionSetup& setup);

// Writes a sysctl of the calling thread's namespace ("net/ipv4/tcp_rmem").
Status WriteSysctl(const std::string& key, const std::string& value);
StatusOr<std::string> ReadSysctl(const std::string& key);

// Reads a feature flag of a device of the calling thread's namespace through SIOCETHTOOL
// (cmd is e.g. ETHTOOL_GTSO); used to verify and document that offloads are off.
StatusOr<bool> ReadOffload(const std::string& dev, uint32_t cmd);

}  // namespace strait::wanem

#endif  // STRAIT_BENCH_WANEM_NETNS_H_
