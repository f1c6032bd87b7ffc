// Cross-region tunnels end to end: two straitd processes (regions "a" and "b") on 127.0.0.1 over
// plain TCP. A listener behind a's gateway and a connector behind b's exchange messages of 0, 1,
// 4 KiB and 8 MiB both ways (intact, in order, tags kept; the 8 MiB float ramp goes zstd over the
// WAN hop); eight tunnels run at once; connects to an unknown listen id, a wrong shard, an
// unknown region or the own region are refused with the reason; a close on either side reaches
// the other after everything sent before; a reader that stops reading makes the sender block
// instead of letting the gateways buffer without limit; a peer gateway killed ends the tunnel
// with a reason and a later open is refused within its deadline; SIGTERM ends listens and
// tunnels with a reason and the daemon still exits 0.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "localproto/client.h"
#include "gateway/tunnel.h"
#include "tests/common/free_ports.h"
#include "tests/common/stats_text.h"
#include "tests/common/straitd_process.h"

namespace strait::gateway {

// The local protocol and its client (strait::localproto), which these tests drive.
using namespace strait::localproto;  // NOLINT(build/namespaces)
namespace {

const char* const kNames[2] = {"a", "b"};

using strait::test::FreePorts;
using strait::test::KillProcesses;
using strait::test::StopProcesses;
using strait::test::SpawnProcess;

// Deterministic bytes for message `index` of `stream`, `size` long. Even sizes that are a
// multiple of 4 get a float ramp (compressible, as gradients often are); others a PRNG stream.
std::vector<uint8_t> Payload(uint64_t stream, uint64_t index, size_t size, bool compressible) {
  std::vector<uint8_t> v(size);
  if (compressible && size % 4 == 0) {
    for (size_t i = 0; i < size / 4; ++i) {
      const float f = static_cast<float>(i % 4096) * 0.25f + static_cast<float>(stream);
      std::memcpy(&v[i * 4], &f, 4);
    }
  } else {
    std::mt19937_64 rng(stream * 1'000'003 + index);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
  }
  return v;
}

class StraitdTunnel : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(STRAITD_PATH, X_OK), 0) << STRAITD_PATH << " is not built";
    char tmpl[] = "/tmp/straitd-tunnel-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const std::vector<uint16_t> ports = FreePorts(2);
    for (int r = 0; r < 2; ++r) {
      std::string c = "region = \"" + std::string(kNames[r]) + "\"\nshard_index = 0\n";
      // 65534 (nobody) too, for the test of who may accept.
      c += "[local]\nsocket = \"" + Socket(r) + "\"\nallowed_uids = [" +
           std::to_string(::getuid()) + ", 65534]\n";
      c +=
          "[wan]\nlisten = \"127.0.0.1:" + std::to_string(ports[r]) + "\"\ntransport = \"plain\"\n";
      const int p = 1 - r;
      c += "[peers." + std::string(kNames[p]) +
           "]\nshard_0 = \"127.0.0.1:" + std::to_string(ports[p]) + "\"\n";
      // A peer that is gone is declared so after 2 s (the kill test waits for that).
      c += "[link]\nstreams = 2\nadapt_streams = false\nunreachable_after = \"2s\"\n";
      c += "[allreduce]\nshutdown_grace = \"2s\"\n";
      const std::string file = dir_ + "/" + kNames[r] + ".toml";
      std::ofstream(file) << c;
      files_.push_back(file);
    }
    for (int r = 0; r < 2; ++r) {
      pids_.push_back(SpawnProcess({STRAITD_PATH, "--config", files_[static_cast<size_t>(r)]}));
    }
  }

  void TearDown() override {
    // SIGTERM first, not SIGKILL: after every test each daemon still running must exit 0. Under
    // ThreadSanitizer (the tsan preset) that is also where a data race shows, as TSan's exit
    // code 66 (issue 17: Supervise() read a tunnel's phase that OnWanMessage wrote).
    for (int code : StopProcesses(&pids_, 10)) {
      if (code != -1) {
        EXPECT_EQ(code, 0) << "a straitd did not exit cleanly on SIGTERM";
      }
    }
    KillProcesses(&pids_);
    for (const auto& f : files_) ::unlink(f.c_str());
    for (int r = 0; r < 2; ++r) ::unlink(Socket(r).c_str());
    ::rmdir(dir_.c_str());
  }

  std::string Socket(int r) const { return dir_ + "/" + kNames[r] + ".sock"; }

  std::string Stats(int r) {
    auto client = Client::Connect(Socket(r), Deadline::AfterSeconds(10));
    if (!client.ok()) return client.status().ToString();
    auto stats = (*client)->Stats(Deadline::AfterSeconds(5));
    return stats.ok() ? *stats : stats.status().ToString();
  }

  // A listener in region a and a tunnel from region b to it, accepted.
  struct Pair {
    std::unique_ptr<TunnelListener> listener;
    std::unique_ptr<TunnelConnection> a;  // the accepting end, in region a
    std::unique_ptr<TunnelConnection> b;  // the connecting end, in region b
  };
  Pair Open() {
    Pair p;
    auto listener = TunnelListener::Listen(Socket(0), Deadline::AfterSeconds(10));
    EXPECT_TRUE(listener.ok()) << listener.status();
    if (!listener.ok()) return p;
    p.listener = std::move(listener).value();
    EXPECT_EQ(p.listener->region(), "a");
    EXPECT_EQ(p.listener->shard(), 0u);
    StatusOr<std::unique_ptr<TunnelConnection>> b = UnavailableError("not run");
    std::thread connector([&] {
      b = TunnelConnection::Connect(Socket(1), p.listener->region(), p.listener->shard(),
                                    p.listener->listen_id(), Deadline::AfterSeconds(20));
    });
    auto a = p.listener->Accept(Deadline::AfterSeconds(20));
    connector.join();
    EXPECT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(b.ok()) << b.status();
    if (a.ok() && b.ok()) {
      p.a = std::move(a).value();
      p.b = std::move(b).value();
      EXPECT_EQ(p.a->peer_region(), "b");
      EXPECT_EQ(p.a->tunnel_id(), p.b->tunnel_id());
    }
    return p;
  }

  std::string dir_;
  std::vector<std::string> files_;
  std::vector<pid_t> pids_;
};

// Sends `sizes` (message i has tag 100 + i) on `from` while `to` receives and checks them.
void Exchange(TunnelConnection& from, TunnelConnection& to, uint64_t stream,
              const std::vector<size_t>& sizes, bool compressible) {
  Status sent;
  std::thread sender([&] {
    for (size_t i = 0; i < sizes.size() && sent.ok(); ++i) {
      sent = from.Send(Payload(stream, i, sizes[i], compressible), static_cast<uint32_t>(100 + i),
                       Deadline::AfterSeconds(30));
    }
  });
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto m = to.Receive(Deadline::AfterSeconds(30));
    ASSERT_TRUE(m.ok()) << "message " << i << ": " << m.status();
    EXPECT_EQ(m->tag, 100 + i);
    ASSERT_EQ(m->data.size(), sizes[i]) << "message " << i;
    EXPECT_TRUE(m->data == Payload(stream, i, sizes[i], compressible)) << "message " << i;
  }
  sender.join();
  EXPECT_TRUE(sent.ok()) << sent;
}

TEST_F(StraitdTunnel, MessagesOfEverySizeBothWaysIntactAndInOrder) {
  Pair p = Open();
  ASSERT_TRUE(p.a && p.b);
  const std::vector<size_t> sizes = {0, 1, 4096, 8u << 20, 0, 3, 8u << 20};
  // b -> a with compressible floats (zstd pays on the first probe), a -> b with random bytes
  // (zstd does not: raw), at the same time.
  std::thread other([&] { Exchange(*p.a, *p.b, 2, sizes, /*compressible=*/false); });
  Exchange(*p.b, *p.a, 1, sizes, /*compressible=*/true);
  other.join();

  const std::string b = Stats(1);
  const auto messages = static_cast<int64_t>(sizes.size());
  EXPECT_EQ(test::StatValue(b, "tunnel_messages_sent"), messages) << b;
  EXPECT_EQ(test::StatValue(b, "tunnel_messages_received"), messages) << b;
  EXPECT_GE(test::StatValue(b, "tunnel_zstd_messages"), 1) << b;
  const int64_t wire = test::StatValue(b, "tunnel_wire_bytes_sent");
  EXPECT_GT(wire, 0) << b;
  EXPECT_LT(wire, test::StatValue(b, "tunnel_raw_bytes_sent")) << b;
  const std::string a = Stats(0);
  EXPECT_EQ(test::StatValue(a, "tunnel_zstd_messages"), 0) << "random bytes do not compress\n" << a;
  EXPECT_EQ(test::StatValue(a, "tunnels_open"), 1) << a;
}

TEST_F(StraitdTunnel, EightTunnelsAtOnce) {
  constexpr int kTunnels = 8;
  auto listener = TunnelListener::Listen(Socket(0), Deadline::AfterSeconds(10));
  ASSERT_TRUE(listener.ok()) << listener.status();
  std::vector<std::unique_ptr<TunnelConnection>> ends_b(kTunnels), ends_a(kTunnels);
  std::vector<Status> status(kTunnels);
  std::vector<std::thread> connectors;
  for (int i = 0; i < kTunnels; ++i) {
    connectors.emplace_back([&, i] {
      auto c = TunnelConnection::Connect(Socket(1), "a", 0, (*listener)->listen_id(),
                                         Deadline::AfterSeconds(20));
      if (!c.ok()) {
        status[static_cast<size_t>(i)] = c.status();
        return;
      }
      ends_b[static_cast<size_t>(i)] = std::move(c).value();
    });
  }
  for (int i = 0; i < kTunnels; ++i) {
    auto a = (*listener)->Accept(Deadline::AfterSeconds(20));
    ASSERT_TRUE(a.ok()) << a.status();
    ends_a[static_cast<size_t>(i)] = std::move(a).value();
  }
  for (auto& t : connectors) t.join();
  for (const Status& s : status) ASSERT_TRUE(s.ok()) << s;
  // Pair the ends by tunnel id, then run every tunnel both ways at once.
  std::vector<std::thread> runs;
  for (int i = 0; i < kTunnels; ++i) {
    TunnelConnection* b = ends_b[static_cast<size_t>(i)].get();
    TunnelConnection* a = nullptr;
    for (auto& e : ends_a) {
      if (e->tunnel_id() == b->tunnel_id()) a = e.get();
    }
    ASSERT_NE(a, nullptr) << "no accepted end for tunnel " << b->tunnel_id();
    const std::vector<size_t> sizes = {100, 70'000, 0, 300'000, 5, 1u << 20};
    runs.emplace_back([a, b, i, sizes] { Exchange(*b, *a, 10 + i, sizes, i % 2 == 0); });
    runs.emplace_back([a, b, i, sizes] { Exchange(*a, *b, 20 + i, sizes, i % 2 == 1); });
  }
  for (auto& t : runs) t.join();
  EXPECT_EQ(test::StatValue(Stats(1), "tunnels_opened"), kTunnels);
}

TEST_F(StraitdTunnel, BadConnectsAreRefusedWithTheReason) {
  auto listener = TunnelListener::Listen(Socket(0), Deadline::AfterSeconds(10));
  ASSERT_TRUE(listener.ok()) << listener.status();
  const uint64_t id = (*listener)->listen_id();
  // Let the link come up first, so that the unknown-id case is answered by region a.
  Pair warm = Open();
  ASSERT_TRUE(warm.a && warm.b);

  auto c = TunnelConnection::Connect(Socket(1), "a", 0, id + 1, Deadline::AfterSeconds(10));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound) << c.status();
  EXPECT_NE(c.status().message().find("has no listen id " + std::to_string(id + 1)),
            std::string::npos)
      << c.status();

  c = TunnelConnection::Connect(Socket(1), "a", 3, id, Deadline::AfterSeconds(10));
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status();
  EXPECT_NE(c.status().message().find("shard 3"), std::string::npos) << c.status();
  c = TunnelConnection::Connect(Socket(1), "mars", 0, id, Deadline::AfterSeconds(10));
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound) << c.status();
  EXPECT_NE(c.status().message().find("mars"), std::string::npos) << c.status();
  c = TunnelConnection::Connect(Socket(1), "b", 0, id, Deadline::AfterSeconds(10));
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();

  // Accepting an id nobody announced.
  // (Accept goes through an incoming event; a raw accept request shows the gateway's answer.)
  auto raw = Client::Connect(Socket(0), Deadline::AfterSeconds(5));
  ASSERT_TRUE(raw.ok());
  Message accept;
  accept.type = MessageType::kTunnelAccept;
  accept.tunnel_id = 42;
  auto frame = EncodeMessage(accept);
  ASSERT_TRUE(frame.ok());
  auto reply = (*raw)->SendRawForTest(*frame, Deadline::AfterSeconds(5));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->reply_to, MessageType::kTunnelAccept);
  EXPECT_EQ(reply->code, StatusCode::kNotFound) << reply->text;

  // A closed listen takes no more connects. The gateway notices the close within a poll slice;
  // a connect announced to it meanwhile is refused as soon as it does.
  listener->reset();
  Status s;
  for (int i = 0; i < 50; ++i) {
    s = TunnelConnection::Connect(Socket(1), "a", 0, id, Deadline::AfterSeconds(10)).status();
    if (s.code() == StatusCode::kNotFound) break;
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
    EXPECT_NE(s.message().find("closed its listen before accepting"), std::string::npos) << s;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
  const std::string stats = Stats(1);
  EXPECT_GE(test::StatValue(stats, "tunnels_refused"), 5) << stats;
  // The refusals left the tunnel that was open untouched.
  Exchange(*warm.b, *warm.a, 7, {10, 20}, false);
}

TEST_F(StraitdTunnel, CloseReachesTheOtherSideAfterTheData) {
  {
    Pair p = Open();
    ASSERT_TRUE(p.a && p.b);
    for (uint32_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(p.b->Send(Payload(5, i, 200'000, true), i, Deadline::AfterSeconds(10)).ok());
    }
    p.b.reset();  // the connector closes
    for (uint32_t i = 0; i < 3; ++i) {
      auto m = p.a->Receive(Deadline::AfterSeconds(10));
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_TRUE(m->data == Payload(5, i, 200'000, true));
    }
    auto end = p.a->Receive(Deadline::AfterSeconds(10));
    EXPECT_EQ(end.status().code(), StatusCode::kOutOfRange) << end.status();
    EXPECT_NE(end.status().message().find("closed"), std::string::npos) << end.status();
    // It stays ended.
    EXPECT_EQ(p.a->Receive(Deadline::AfterSeconds(1)).status().code(), StatusCode::kOutOfRange);
  }
  {
    Pair p = Open();
    ASSERT_TRUE(p.a && p.b);
    ASSERT_TRUE(p.a->Send(Payload(6, 0, 10, false), 1, Deadline::AfterSeconds(10)).ok());
    p.a->Close();  // the listener's side closes
    auto m = p.b->Receive(Deadline::AfterSeconds(10));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->tag, 1u);
    auto end = p.b->Receive(Deadline::AfterSeconds(10));
    EXPECT_EQ(end.status().code(), StatusCode::kOutOfRange) << end.status();
  }
  // Both tunnels are gone from both gateways.
  for (int r = 0; r < 2; ++r) {
    int64_t open = 1;
    for (int i = 0; i < 50 && open != 0; ++i) {
      open = test::StatValue(Stats(r), "tunnels_open");
      if (open != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(open, 0) << kNames[r];
  }
}

TEST_F(StraitdTunnel, ASlowReaderBlocksTheSenderInsteadOfGrowingBuffers) {
  Pair p = Open();
  ASSERT_TRUE(p.a && p.b);
  constexpr size_t kMessage = 1u << 20;
  constexpr int kMessages = 64;  // 64 MiB: far more than the 16 MiB window and socket buffers
  std::atomic<int> sent{0};
  Status stalled;
  std::thread sender([&] {
    for (int i = 0; i < kMessages; ++i) {
      // Random bytes: no compression, so the window counts what the gateway really holds.
      Status s = p.b->Send(Payload(8, static_cast<uint64_t>(i), kMessage, false),
                           static_cast<uint32_t>(i), Deadline::AfterSeconds(3));
      if (!s.ok()) {
        stalled = s;
        return;
      }
      ++sent;
    }
  });
  sender.join();  // a reader that never reads: the sender must stall
  EXPECT_EQ(stalled.code(), StatusCode::kDeadlineExceeded) << stalled;
  EXPECT_LT(sent.load(), 40) << "the gateways took " << sent.load()
                             << " MiB for a reader that reads nothing";
  EXPECT_GE(sent.load(), 8);
  // Everything the sender completed arrives intact once the reader reads.
  for (int i = 0; i < sent.load(); ++i) {
    auto m = p.a->Receive(Deadline::AfterSeconds(20));
    ASSERT_TRUE(m.ok()) << i << ": " << m.status();
    EXPECT_EQ(m->tag, static_cast<uint32_t>(i));
    EXPECT_TRUE(m->data == Payload(8, static_cast<uint64_t>(i), kMessage, false)) << i;
  }
}

TEST_F(StraitdTunnel, PeerGatewayGoneEndsTheTunnelWithAReason) {
  Pair p = Open();
  ASSERT_TRUE(p.a && p.b);
  const uint64_t listen_id = p.listener->listen_id();
  ::kill(pids_[0], SIGKILL);  // region a's gateway
  ::waitpid(pids_[0], nullptr, 0);
  pids_[0] = -1;
  // The connector's tunnel ends with the reason once the link gives up (unreachable_after 2 s).
  auto end = p.b->Receive(Deadline::AfterSeconds(20));
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.status().code(), StatusCode::kUnavailable) << end.status();
  EXPECT_NE(end.status().message().find("region a"), std::string::npos) << end.status();
  // A new open to the dead region is refused, within its deadline.
  const int64_t start = MonotonicNanos();
  auto c = TunnelConnection::Connect(Socket(1), "a", 0, listen_id, Deadline::AfterSeconds(3));
  const double seconds = static_cast<double>(MonotonicNanos() - start) * 1e-9;
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().code() == StatusCode::kUnavailable ||
              c.status().code() == StatusCode::kDeadlineExceeded)
      << c.status();
  EXPECT_LT(seconds, 3 + 2.5) << "the refusal came after the deadline: " << c.status();
}

TEST_F(StraitdTunnel, SigtermEndsListensAndTunnelsWithAReason) {
  Pair p = Open();
  ASSERT_TRUE(p.a && p.b);
  ::kill(pids_[0], SIGTERM);  // region a's gateway shuts down with a tunnel and a listen open
  auto listen_end = p.listener->Accept(Deadline::AfterSeconds(10));
  EXPECT_EQ(listen_end.status().code(), StatusCode::kUnavailable) << listen_end.status();
  EXPECT_NE(listen_end.status().message().find("shutting down"), std::string::npos)
      << listen_end.status();
  auto a_end = p.a->Receive(Deadline::AfterSeconds(10));
  EXPECT_EQ(a_end.status().code(), StatusCode::kUnavailable) << a_end.status();
  auto b_end = p.b->Receive(Deadline::AfterSeconds(10));
  EXPECT_EQ(b_end.status().code(), StatusCode::kUnavailable) << b_end.status();
  EXPECT_NE(b_end.status().message().find("region a"), std::string::npos) << b_end.status();
  int status = -1;
  for (int i = 0; i < 200 && ::waitpid(pids_[0], &status, WNOHANG) != pids_[0]; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  if (WIFEXITED(status)) pids_[0] = -1;
}

// A raw local-protocol connection (hello done), for requests the blocking clients do not make.
int RawDial(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {  // the gateway may still be starting
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd);
      fd = -1;
      if ((errno != ENOENT && errno != ECONNREFUSED) || attempt == 200) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  Message hello;
  hello.type = MessageType::kHello;
  auto frame = EncodeMessage(hello);
  auto body = WriteAll(fd, *frame, Deadline::AfterSeconds(5)).ok()
                  ? ReadFrame(fd, kDefaultMaxMessageBytes, Deadline::AfterSeconds(5))
                  : StatusOr<std::vector<uint8_t>>(UnavailableError("write"));
  if (!body.ok() || DecodeMessage(*body)->code != StatusCode::kOk) {
    ::close(fd);
    return -1;
  }
  return fd;
}

StatusOr<Message> RawCall(int fd, const Message& request) {
  auto frame = EncodeMessage(request);
  if (!frame.ok()) return frame.status();
  STRAIT_RETURN_IF_ERROR(WriteAll(fd, *frame, Deadline::AfterSeconds(10)));
  STRAIT_ASSIGN_OR_RETURN(std::vector<uint8_t> body,
                          ReadFrame(fd, kDefaultMaxMessageBytes, Deadline::AfterSeconds(10)));
  return DecodeMessage(body);
}

TEST_F(StraitdTunnel, OnlyTheListenersUidMayAccept) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  // The other uid keeps gid 0, so the group bits let it reach the socket.
  ASSERT_EQ(::chmod(dir_.c_str(), 0750), 0);
  const int listen_fd = RawDial(Socket(0));
  ASSERT_GE(listen_fd, 0);
  Message listen;
  listen.type = MessageType::kTunnelListen;
  auto listening = RawCall(listen_fd, listen);
  ASSERT_TRUE(listening.ok()) << listening.status();
  auto info = DecodeTunnelEvent(listening->data);
  ASSERT_TRUE(info.ok()) << info.status();
  StatusOr<std::unique_ptr<TunnelConnection>> b = UnavailableError("not run");
  std::thread connector([&] {
    b = TunnelConnection::Connect(Socket(1), "a", 0, info->id, Deadline::AfterSeconds(20));
  });
  auto body = ReadFrame(listen_fd, kDefaultMaxMessageBytes, Deadline::AfterSeconds(20));
  ASSERT_TRUE(body.ok()) << body.status();
  auto incoming_reply = DecodeMessage(*body);
  ASSERT_TRUE(incoming_reply.ok()) << incoming_reply.status();
  auto incoming = DecodeTunnelEvent(incoming_reply->data);
  ASSERT_TRUE(incoming.ok()) << incoming.status();
  ASSERT_EQ(incoming->kind, TunnelEventKind::kIncoming);
  EXPECT_EQ(incoming->region, "b");
  Message accept;
  accept.type = MessageType::kTunnelAccept;
  accept.tunnel_id = incoming->id;
  // Another uid, on this thread only (the raw syscall, unlike setresuid(3), leaves the other
  // threads alone); SO_PEERCRED records it at connect.
  StatusOr<Message> stolen = UnavailableError("not run");
  std::thread other([&] {
    if (::syscall(SYS_setresuid, -1, 65534, -1) != 0) {
      stolen = InternalError("setresuid failed");
      return;
    }
    const int fd = RawDial(Socket(0));
    stolen = fd < 0 ? UnavailableError("nobody cannot reach the socket") : RawCall(fd, accept);
    if (fd >= 0) ::close(fd);
  });
  other.join();
  ASSERT_TRUE(stolen.ok()) << stolen.status();
  EXPECT_EQ(stolen->code, StatusCode::kPermissionDenied) << stolen->text;
  EXPECT_NE(stolen->text.find("uid 65534"), std::string::npos) << stolen->text;
  // The listener's own uid still accepts it, and the connector's open completes.
  const int accept_fd = RawDial(Socket(0));
  ASSERT_GE(accept_fd, 0);
  auto accepted = RawCall(accept_fd, accept);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(accepted->code, StatusCode::kOk) << accepted->text;
  connector.join();
  EXPECT_TRUE(b.ok()) << b.status();
  ::close(accept_fd);
  ::close(listen_fd);
}

// Threads of process `pid` now (its /proc/<pid>/task entries); -1 when it is gone.
int ThreadCount(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/task", ec), end;
       !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return ec ? -1 : n;
}

// Open tunnels cost connections and buffers, not threads: 40 tunnels (each with its own listen)
// leave both daemons with no more threads than one did (a tunnel used to add a reader and a
// writer thread on each side, a listen one more).
TEST_F(StraitdTunnel, OpenTunnelsCostNoThreads) {
  std::vector<Pair> pairs;
  pairs.push_back(Open());
  ASSERT_TRUE(pairs[0].a && pairs[0].b);
  Exchange(*pairs[0].b, *pairs[0].a, 1, {10, 100'000}, true);
  const int one[2] = {ThreadCount(pids_[0]), ThreadCount(pids_[1])};
  for (int i = 1; i < 40; ++i) {
    pairs.push_back(Open());
    ASSERT_TRUE(pairs.back().a && pairs.back().b) << "tunnel " << i;
  }
  // Every tunnel carries data both ways.
  for (size_t i = 0; i < pairs.size(); ++i) {
    Exchange(*pairs[i].b, *pairs[i].a, 100 + i, {1, 5000}, false);
    Exchange(*pairs[i].a, *pairs[i].b, 200 + i, {7}, false);
  }
  const int forty[2] = {ThreadCount(pids_[0]), ThreadCount(pids_[1])};
  std::printf("straitd threads (a, b): %d, %d with 1 tunnel; %d, %d with 40\n", one[0], one[1],
              forty[0], forty[1]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(one[r], 0);
    EXPECT_LE(forty[r], one[r]) << kNames[r] << ": open tunnels cost threads";
  }
  EXPECT_EQ(test::StatValue(Stats(0), "tunnels_open"), 40);
}

}  // namespace
}  // namespace strait::gateway
