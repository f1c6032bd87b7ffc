// The region rendezvous of host-backend comms (see bootstrap.h): blocking sockets with poll().
#include "api/bootstrap.h"
#include "common/strings.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

namespace strait::api {
namespace {

constexpr char kMagic[4] = {'S', 'T', 'R', 'B'};
// A join or reply is small; anything larger than this is garbage.
constexpr size_t kMaxStringBytes = 1024;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Close();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  ~Fd() { Close(); }
  int get() const { return fd_; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

std::string Errno(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// Waits until `fd` is ready for `events` or the deadline passed.
Status WaitFd(int fd, short events, Deadline deadline, const std::string& what) {
  for (;;) {
    const int64_t left_ms = deadline.IsInfinite() ? -1 : deadline.RemainingNanos() / 1'000'000;
    if (!deadline.IsInfinite() && left_ms <= 0) {
      return DeadlineExceededError("timed out " + what);
    }
    pollfd p{fd, events, 0};
    const int rc =
        ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms < 0 ? 1000 : left_ms, 1000)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return UnavailableError(Errno("poll"));
    if (rc > 0) return Status::Ok();
  }
}

Status WriteAll(int fd, const std::vector<uint8_t>& bytes, Deadline deadline,
                const std::string& peer) {
  size_t done = 0;
  while (done < bytes.size()) {
    STRAIT_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, "writing to " + peer));
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return UnavailableError(Errno(("writing to " + peer).c_str()));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status ReadAll(int fd, void* out, size_t size, Deadline deadline, const std::string& peer) {
  auto* p = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < size) {
    STRAIT_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, "reading from " + peer));
    const ssize_t n = ::recv(fd, p + done, size - done, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return UnavailableError(Errno(("reading from " + peer).c_str()));
    if (n == 0) return UnavailableError(peer + " closed the connection during the rendezvous");
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

class Writer {
 public:
  void U8(uint8_t v) { b.push_back(v); }
  void U16(uint16_t v) {
    for (int i = 0; i < 2; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void Str(const std::string& s) {
    const size_t n = std::min(s.size(), kMaxStringBytes);
    U16(static_cast<uint16_t>(n));
    b.insert(b.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
  }
  std::vector<uint8_t> b;
};

// Reads little-endian fields straight from a socket.
class Reader {
 public:
  Reader(int fd, Deadline deadline, std::string peer)
      : fd_(fd), deadline_(deadline), peer_(std::move(peer)) {}
  StatusOr<uint8_t> U8() {
    uint8_t v = 0;
    STRAIT_RETURN_IF_ERROR(ReadAll(fd_, &v, 1, deadline_, peer_));
    return v;
  }
  StatusOr<uint16_t> U16() {
    uint8_t v[2];
    STRAIT_RETURN_IF_ERROR(ReadAll(fd_, v, 2, deadline_, peer_));
    return static_cast<uint16_t>(v[0] | v[1] << 8);
  }
  StatusOr<uint32_t> U32() {
    uint8_t v[4];
    STRAIT_RETURN_IF_ERROR(ReadAll(fd_, v, 4, deadline_, peer_));
    return uint32_t{v[0]} | uint32_t{v[1]} << 8 | uint32_t{v[2]} << 16 | uint32_t{v[3]} << 24;
  }
  StatusOr<std::string> Str() {
    STRAIT_ASSIGN_OR_RETURN(uint16_t n, U16());
    if (n > kMaxStringBytes) {
      return DataLossError(peer_ + " sent a " + std::to_string(n) +
                           "-byte string in the rendezvous (at most " +
                           std::to_string(kMaxStringBytes) + ")");
    }
    std::string s(n, '\0');
    if (n > 0) STRAIT_RETURN_IF_ERROR(ReadAll(fd_, s.data(), n, deadline_, peer_));
    return s;
  }
  // The magic, version and kind every message starts with.
  Status Header(BootstrapKind kind) {
    char magic[4];
    STRAIT_RETURN_IF_ERROR(ReadAll(fd_, magic, 4, deadline_, peer_));
    if (std::memcmp(magic, kMagic, 4) != 0) {
      return DataLossError(peer_ +
                           " is not a Strait rank (bad rendezvous magic): is another "
                           "program using the root address?");
    }
    STRAIT_ASSIGN_OR_RETURN(uint8_t version, U8());
    if (version != kBootstrapVersion) {
      return DataLossError(peer_ + " speaks rendezvous version " + std::to_string(version) +
                           ", this library " + std::to_string(kBootstrapVersion) +
                           ": run the same Strait version on every rank");
    }
    STRAIT_ASSIGN_OR_RETURN(uint8_t k, U8());
    if (k != static_cast<uint8_t>(kind)) {
      return DataLossError(peer_ + " sent rendezvous message kind " + std::to_string(k) +
                           " where kind " + std::to_string(static_cast<int>(kind)) + " belongs");
    }
    return Status::Ok();
  }

 private:
  int fd_;
  Deadline deadline_;
  std::string peer_;
};

void PutHeader(Writer& w, BootstrapKind kind) {
  for (char c : kMagic) w.U8(static_cast<uint8_t>(c));
  w.U8(kBootstrapVersion);
  w.U8(static_cast<uint8_t>(kind));
}

StatusOr<addrinfo*> Resolve(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return InvalidArgumentError("root_address: '" + host +
                                "' is not a numeric IPv4 or IPv6 "
                                "address (" +
                                ::gai_strerror(rc) + ")");
  }
  return res;
}

std::string PeerHost(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
  } else if (ss.ss_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
    // An IPv4 peer on a dual-stack socket: give its plain IPv4 form.
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      ::inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], buf, sizeof(buf));
    } else {
      ::inet_ntop(AF_INET6, &a6->sin6_addr, buf, sizeof(buf));
    }
  }
  return buf;
}

std::vector<uint8_t> Refusal(const std::string& reason) {
  Writer w;
  PutHeader(w, BootstrapKind::kReply);
  w.U8(0);
  w.U8(0);
  w.Str(reason);
  return w.b;
}

struct Joined {
  Fd fd;
  RankAddress address;
};

StatusOr<std::vector<RankAddress>> RunRoot(const BootstrapOptions& o, Deadline deadline) {
  const std::string where = o.root_host + ":" + std::to_string(o.root_port);
  STRAIT_ASSIGN_OR_RETURN(addrinfo * ai, Resolve(o.root_host, o.root_port));
  Fd listener(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int one = 1;
  Status bound = Status::Ok();
  if (listener.get() < 0) {
    bound = UnavailableError(Errno("socket"));
  } else {
    ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(listener.get(), ai->ai_addr, ai->ai_addrlen) != 0 ||
        ::listen(listener.get(), 128) != 0) {
      bound =
          UnavailableError("rank 0 cannot listen on root_address " + where + ": " +
                           std::strerror(errno) + " (use an address of this host and a free port)");
    }
  }
  ::freeaddrinfo(ai);
  STRAIT_RETURN_IF_ERROR(bound);

  std::map<int, Joined> joined;  // by rank
  Status failure = Status::Ok();
  while (static_cast<int>(joined.size()) < o.nranks - 1) {
    Status w = WaitFd(listener.get(), POLLIN, deadline, "");
    if (!w.ok()) {
      std::string missing;
      for (int r = 1; r < o.nranks; ++r) {
        if (joined.count(r) == 0) AppendToList(missing, std::to_string(r));
      }
      failure = DeadlineExceededError("rank 0 of region " + o.region + " waited at " + where +
                                      " for rank(s) " + missing +
                                      " to join: start every rank of the region with the same "
                                      "root_address and nranks");
      break;
    }
    Fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (conn.get() < 0) continue;
    const std::string peer = "a rank at " + PeerHost(conn.get());
    // A stray connection gets a few seconds, so that it cannot hold up the rendezvous.
    const Deadline read_by =
        Deadline::After(std::min<int64_t>(deadline.RemainingNanos(), int64_t{5'000'000'000}));
    Reader r(conn.get(), read_by, peer);
    uint16_t port = 0;
    uint32_t rank = 0, nranks = 0;
    std::string job, region;
    const auto read_join = [&]() -> Status {
      STRAIT_RETURN_IF_ERROR(r.Header(BootstrapKind::kJoin));
      STRAIT_ASSIGN_OR_RETURN(port, r.U16());
      STRAIT_ASSIGN_OR_RETURN(rank, r.U32());
      STRAIT_ASSIGN_OR_RETURN(nranks, r.U32());
      STRAIT_ASSIGN_OR_RETURN(job, r.Str());
      STRAIT_ASSIGN_OR_RETURN(region, r.Str());
      return Status::Ok();
    };
    // Garbage or a rank that died: ignore that connection, keep waiting for the real ones.
    if (!read_join().ok()) continue;
    std::string why;
    const std::string who = "rank " + std::to_string(rank) + " (at " + PeerHost(conn.get()) + ")";
    if (nranks != static_cast<uint32_t>(o.nranks)) {
      why = who + " has nranks " + std::to_string(nranks) + ", rank 0 has " +
            std::to_string(o.nranks);
    } else if (job != o.job) {
      why = who + " has job id '" + job + "', rank 0 has '" + o.job + "'";
    } else if (region != o.region) {
      why = who + " is in region '" + region + "', rank 0 in '" + o.region + "'";
    } else if (rank == 0 || rank >= nranks) {
      why = who + " claims a rank outside 1.." + std::to_string(o.nranks - 1);
    } else if (joined.count(static_cast<int>(rank)) != 0) {
      why = who + " joined twice (two ranks with the same rank number?)";
    }
    if (!why.empty()) {
      failure = FailedPreconditionError("the region's ranks disagree: " + why);
      WriteAll(conn.get(), Refusal(failure.message()), read_by, who).IgnoreError();
      break;
    }
    RankAddress address{PeerHost(conn.get()), port};
    joined[static_cast<int>(rank)] = Joined{std::move(conn), std::move(address)};
  }
  if (!failure.ok()) {
    for (auto& [rank, j] : joined) {
      WriteAll(j.fd.get(), Refusal(failure.message()), deadline, "rank " + std::to_string(rank))
          .IgnoreError();
    }
    return failure;
  }
  std::vector<RankAddress> table(static_cast<size_t>(o.nranks));
  table[0] = RankAddress{o.root_host, o.data_port};
  for (auto& [rank, j] : joined) table[static_cast<size_t>(rank)] = j.address;
  Writer w;
  PutHeader(w, BootstrapKind::kReply);
  w.U8(1);
  w.U8(0);
  w.U32(static_cast<uint32_t>(o.nranks));
  for (int r = 0; r < o.nranks; ++r) {
    w.U16(table[static_cast<size_t>(r)].port);
    w.Str(r == 0 ? std::string() : table[static_cast<size_t>(r)].host);
  }
  for (auto& [rank, j] : joined) {
    STRAIT_RETURN_IF_ERROR(WriteAll(j.fd.get(), w.b, deadline, "rank " + std::to_string(rank))
                               .WithContext("rendezvous"));
  }
  return table;
}

StatusOr<std::vector<RankAddress>> RunMember(const BootstrapOptions& o, Deadline deadline) {
  const std::string where = o.root_host + ":" + std::to_string(o.root_port);
  const std::string root = "rank 0 of region " + o.region + " at " + where;
  Fd conn;
  std::string last_error;
  // Rank 0 may start later than this rank: retry until it listens, as a TCP store client does.
  for (;;) {
    STRAIT_ASSIGN_OR_RETURN(addrinfo * ai, Resolve(o.root_host, o.root_port));
    Fd fd(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const bool ok = fd.get() >= 0 && ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0;
    if (!ok) last_error = std::strerror(errno);
    ::freeaddrinfo(ai);
    if (ok) {
      conn = std::move(fd);
      break;
    }
    if (deadline.Expired()) {
      return UnavailableError("cannot reach " + root + ": " + last_error +
                              " (is rank 0 running, and is root_address its address?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int one = 1;
  ::setsockopt(conn.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  Writer w;
  PutHeader(w, BootstrapKind::kJoin);
  w.U16(o.data_port);
  w.U32(static_cast<uint32_t>(o.rank));
  w.U32(static_cast<uint32_t>(o.nranks));
  w.Str(o.job);
  w.Str(o.region);
  STRAIT_RETURN_IF_ERROR(WriteAll(conn.get(), w.b, deadline, root));
  Reader r(conn.get(), deadline, root);
  Status s = r.Header(BootstrapKind::kReply);
  if (s.code() == StatusCode::kDeadlineExceeded) {
    return DeadlineExceededError("joined " + root +
                                 ", but not every rank of the region joined in time: start "
                                 "every rank with the same root_address and nranks");
  }
  STRAIT_RETURN_IF_ERROR(s);
  STRAIT_ASSIGN_OR_RETURN(uint8_t ok, r.U8());
  STRAIT_ASSIGN_OR_RETURN(uint8_t zero, r.U8());
  (void)zero;
  if (ok != 1) {
    STRAIT_ASSIGN_OR_RETURN(std::string reason, r.Str());
    return FailedPreconditionError(root + " refused this rank: " + reason);
  }
  STRAIT_ASSIGN_OR_RETURN(uint32_t n, r.U32());
  if (n != static_cast<uint32_t>(o.nranks)) {
    return DataLossError(root + " sent a table of " + std::to_string(n) + " ranks, not " +
                         std::to_string(o.nranks));
  }
  std::vector<RankAddress> table(n);
  for (uint32_t i = 0; i < n; ++i) {
    STRAIT_ASSIGN_OR_RETURN(table[i].port, r.U16());
    STRAIT_ASSIGN_OR_RETURN(table[i].host, r.Str());
  }
  table[0].host = o.root_host;
  return table;
}

}  // namespace

StatusOr<std::vector<RankAddress>> Rendezvous(const BootstrapOptions& options, Deadline deadline) {
  if (options.nranks <= 1) {
    return std::vector<RankAddress>{RankAddress{options.root_host, options.data_port}};
  }
  if (options.rank == 0) return RunRoot(options, deadline);
  return RunMember(options, deadline);
}

}  // namespace strait::api
