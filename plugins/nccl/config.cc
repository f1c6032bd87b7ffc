// Parsing and validation of the plugin's STRAIT_* environment, and interface selection.
#include "common/strings.h"
#include "plugins/nccl/config.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "common/units.h"
#include "localproto/policy_grammar.h"

namespace strait::nccl {
namespace {

constexpr const char* kRegionAllowed = "1-63 characters from letters, digits, '-', '_' and '.'";

Status Bad(const char* var, std::string_view found, std::string_view allowed) {
  return InvalidArgumentError(std::string(var) + "=" + QuotedForError(found) +
                              " is invalid; allowed: " + std::string(allowed));
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool ValidJobId(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

bool PrefixMatches(const unsigned char* a, const unsigned char* b, int bits) {
  const int full = bits / 8;
  if (std::memcmp(a, b, static_cast<size_t>(full)) != 0) return false;
  const int rest = bits % 8;
  if (rest == 0) return true;
  const unsigned char mask = static_cast<unsigned char>(0xff << (8 - rest));
  return (a[full] & mask) == (b[full] & mask);
}

int ReadSpeed(const std::string& ifname) {
  std::ifstream in("/sys/class/net/" + ifname + "/speed");
  int speed = 0;
  if (in >> speed && speed > 0) return speed;
  return 0;
}

// NCCL_SOCKET_IFNAME semantics: "^" excludes, "=" matches whole names, otherwise prefixes.
bool NameMatches(const std::string& name, std::string_view spec) {
  bool exclude = false;
  if (!spec.empty() && spec.front() == '^') {
    exclude = true;
    spec.remove_prefix(1);
  }
  bool exact = false;
  if (!spec.empty() && spec.front() == '=') {
    exact = true;
    spec.remove_prefix(1);
  }
  bool any = false;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string_view::npos) comma = spec.size();
    const std::string_view item = Trim(spec.substr(start, comma - start));
    if (!item.empty()) {
      const bool hit = exact ? name == item : name.compare(0, item.size(), item) == 0;
      if (hit) any = true;
    }
    start = comma + 1;
  }
  return exclude ? !any : any;
}

}  // namespace

EnvGetter ProcessEnv() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

bool ValidRegionName(std::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

StatusOr<std::vector<RegionRule>> ParseRegionMap(std::string_view text) {
  constexpr const char* kVar = "STRAIT_REGION_MAP";
  constexpr const char* kAllowed =
      "comma-separated ADDRESS[/PREFIX]=REGION entries, e.g. "
      "\"10.1.0.0/16=us-east,10.2.0.0/16=eu-west\" (IPv4 or IPv6; region names of 1-63 "
      "letters, digits, '-', '_', '.')";
  std::vector<RegionRule> rules;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view entry = Trim(text.substr(start, comma - start));
    start = comma + 1;
    if (entry.empty()) continue;
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos) return Bad(kVar, text, kAllowed);
    const std::string_view net = Trim(entry.substr(0, eq));
    const std::string_view region = Trim(entry.substr(eq + 1));
    if (!ValidRegionName(region)) {
      return InvalidArgumentError(std::string(kVar) + ": region " + QuotedForError(region) + " in entry " +
                                  QuotedForError(entry) + " is invalid; allowed: " + kRegionAllowed);
    }
    RegionRule rule;
    rule.region = std::string(region);
    const size_t slash = net.find('/');
    const std::string addr(net.substr(0, slash));
    if (inet_pton(AF_INET, addr.c_str(), rule.addr) == 1) {
      rule.family = AF_INET;
      rule.prefix_len = 32;
    } else if (inet_pton(AF_INET6, addr.c_str(), rule.addr) == 1) {
      rule.family = AF_INET6;
      rule.prefix_len = 128;
    } else {
      return InvalidArgumentError(std::string(kVar) + ": " + QuotedForError(addr) + " in entry " +
                                  QuotedForError(entry) + " is not an IP address; allowed: " + kAllowed);
    }
    if (slash != std::string_view::npos) {
      const std::string bits(net.substr(slash + 1));
      char* end = nullptr;
      const long n = std::strtol(bits.c_str(), &end, 10);
      if (bits.empty() || *end != '\0' || n < 0 || n > rule.prefix_len) {
        return InvalidArgumentError(std::string(kVar) + ": prefix length " + QuotedForError(bits) +
                                    " in entry " + QuotedForError(entry) + " is invalid; allowed: 0-" +
                                    std::to_string(rule.prefix_len));
      }
      rule.prefix_len = static_cast<int>(n);
    }
    rules.push_back(std::move(rule));
  }
  if (rules.empty()) return Bad(kVar, text, kAllowed);
  return rules;
}

std::optional<std::string> LookupRegion(const std::vector<RegionRule>& map,
                                        const sockaddr_storage& addr) {
  const unsigned char* bytes = nullptr;
  if (addr.ss_family == AF_INET) {
    bytes = reinterpret_cast<const unsigned char*>(
        &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr);
  } else if (addr.ss_family == AF_INET6) {
    bytes = reinterpret_cast<const unsigned char*>(
        &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr);
  } else {
    return std::nullopt;
  }
  const RegionRule* best = nullptr;
  for (const RegionRule& r : map) {
    if (r.family != addr.ss_family) continue;
    if (!PrefixMatches(r.addr, bytes, r.prefix_len)) continue;
    if (best == nullptr || r.prefix_len > best->prefix_len) best = &r;
  }
  if (best == nullptr) return std::nullopt;
  return best->region;
}

StatusOr<PluginConfig> ParseConfig(const EnvGetter& env) {
  PluginConfig c;
  if (auto v = env("STRAIT_REGION")) {
    if (!ValidRegionName(*v)) return Bad("STRAIT_REGION", *v, kRegionAllowed);
    c.region = *v;
  }
  if (auto v = env("STRAIT_REGION_MAP")) {
    STRAIT_ASSIGN_OR_RETURN(c.region_map, ParseRegionMap(*v));
  }
  if (auto v = env("STRAIT_GATEWAY")) {
    // sun_path holds 108 bytes including the terminator.
    if (v->empty() || (*v)[0] != '/' || v->size() > 107) {
      return Bad("STRAIT_GATEWAY", *v,
                 "the absolute path of the local straitd's Unix socket (at most 107 bytes)");
    }
    c.gateway = *v;
  }
  if (auto v = env("STRAIT_JOB_ID")) {
    if (!ValidJobId(*v)) {
      return Bad("STRAIT_JOB_ID", *v, "1-64 characters from letters, digits, '-', '_' and '.'");
    }
    c.job_id = *v;
  }
  if (auto v = env("STRAIT_COMPRESSION")) {
    // The gateway's own grammar (localproto/policy_grammar.h), kept as its canonical text.
    StatusOr<localproto::PolicyRequest> policy = localproto::ParsePolicyRequest(*v);
    if (!policy.ok()) {
      return Bad("STRAIT_COMPRESSION", *v,
                 "straitd's policy grammar (" + policy.status().message() + ")");
    }
    c.compression = localproto::FormatPolicyRequest(*policy);
  }
  if (auto v = env("STRAIT_SOCKET_IFNAME")) {
    std::string_view spec = Trim(*v);
    std::string_view body = spec;
    if (!body.empty() && body.front() == '^') body.remove_prefix(1);
    if (!body.empty() && body.front() == '=') body.remove_prefix(1);
    if (Trim(body).empty() || Trim(body) == ",") {
      return Bad("STRAIT_SOCKET_IFNAME", *v,
                 "comma-separated interface name prefixes, '^' to exclude, '=' for exact names "
                 "(e.g. \"eth0\", \"^docker,lo\", \"=ens1f0\")");
    }
    c.socket_ifname = std::string(spec);
  }
  if (auto v = env("STRAIT_NSOCKS")) {
    char* end = nullptr;
    const long n = std::strtol(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0' || n < 1 || n > 16) {
      return Bad("STRAIT_NSOCKS", *v, "an integer from 1 to 16");
    }
    c.nsocks = static_cast<int>(n);
  }
  if (auto v = env("STRAIT_CONNECT_TIMEOUT")) {
    StatusOr<int64_t> ns = ParseDurationNanos(*v);
    constexpr int64_t kMs = 1000 * 1000;
    if (!ns.ok() || *ns < kMs || *ns > int64_t{3600} * 1000 * kMs) {
      return Bad("STRAIT_CONNECT_TIMEOUT", *v,
                 "a duration from 1ms to 1h, e.g. \"60s\" or \"500ms\"");
    }
    c.connect_timeout_ns = *ns;
  }
  if (auto v = env("STRAIT_LOCAL_SHM")) {
    if (*v != "0" && *v != "1") {
      return Bad("STRAIT_LOCAL_SHM", *v,
                 "1 (CollNet's tensors to straitd through shared memory, the default) or 0 "
                 "(through the socket)");
    }
    c.local_shm = *v == "1";
  }
  if (auto v = env("STRAIT_WAN_LATENCY_US")) {
    char* end = nullptr;
    const double us = std::strtod(v->c_str(), &end);
    if (v->empty() || *end != '\0' || !(us >= 0 && us <= 1e7)) {
      return Bad("STRAIT_WAN_LATENCY_US", *v,
                 "the cross-region one-way latency in microseconds, 0 to 10000000 (e.g. 20000)");
    }
    c.wan_latency_us = us;
  }
  if (auto v = env("STRAIT_WAN_SPEED_MBPS")) {
    char* end = nullptr;
    const long n = std::strtol(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0' || n < 1 || n > 10'000'000) {
      return Bad("STRAIT_WAN_SPEED_MBPS", *v,
                 "the cross-region link speed in Mbit/s, an integer from 1 to 10000000");
    }
    c.wan_speed_mbps = static_cast<int>(n);
  }
  return c;
}

std::string AddressToString(const sockaddr_storage& addr) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, buf, sizeof(buf));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, buf, sizeof(buf));
  } else {
    return "?";
  }
  return buf;
}

StatusOr<Interface> SelectInterface(const std::string& spec) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return UnavailableError(std::string("cannot list network interfaces: ") + std::strerror(errno));
  }
  std::vector<Interface> candidates;
  std::vector<std::string> seen;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || (it->ifa_flags & IFF_UP) == 0) continue;
    const int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    Interface iface;
    iface.name = it->ifa_name;
    std::memcpy(&iface.addr, it->ifa_addr,
                family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    if (family == AF_INET6) {
      // Link-local addresses need a scope id on every peer: skip them like NCCL does.
      const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&iface.addr);
      if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) continue;
    }
    if (std::find(seen.begin(), seen.end(), iface.name) == seen.end()) seen.push_back(iface.name);
    const bool loopback = (it->ifa_flags & IFF_LOOPBACK) != 0;
    if (spec.empty() ? loopback : !NameMatches(iface.name, spec)) continue;
    candidates.push_back(std::move(iface));
  }
  freeifaddrs(list);
  // Prefer IPv4: it is what every peer in a mixed cluster can reach.
  for (int family : {AF_INET, AF_INET6}) {
    for (Interface& c : candidates) {
      if (c.addr.ss_family != family) continue;
      c.speed_mbps = ReadSpeed(c.name);
      return c;
    }
  }
  if (spec.empty()) return SelectInterface("=lo");
  std::string names;
  for (const std::string& n : seen) AppendToList(names, n);
  return InvalidArgumentError("STRAIT_SOCKET_IFNAME=" + QuotedForError(spec) +
                              " matches no interface that is up and has an address; "
                              "allowed: prefixes of (or, with '=', exact) names among: " +
                              names);
}

}  // namespace strait::nccl
