// listen() with STRAIT_GATEWAY set never waits on the gateway when a pre-opened listener is
// ready, and waits a bounded time otherwise (transport.h, Listen). A stand-in gateway on a Unix
// socket speaks straitd's local protocol (the gateway library's own encoder): it answers hellos
// and tunnel listens with fresh listen ids, and can be switched to accept connections but never
// answer (a hung straitd). Also: a connect through a gateway that never answers ends with
// DeadlineExceeded naming STRAIT_CONNECT_TIMEOUT instead of saying "call again" forever.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "localproto/frame_io.h"
#include "localproto/protocol.h"
#include "plugins/nccl/handle.h"
#include "plugins/nccl/transport.h"

namespace strait::nccl {
namespace {

EnvGetter Env(std::map<std::string, std::string> vars) {
  vars.emplace("STRAIT_SOCKET_IFNAME", "lo");
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

bool ReadFull(int fd, void* buf, size_t n) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteFull(int fd, const std::vector<uint8_t>& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t w = send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (w <= 0) return false;
    off += static_cast<size_t>(w);
  }
  return true;
}

// A stand-in straitd for region "a", shard 3: answers hello and kTunnelListen (kListening with a
// new listen id per listen) while `answering`; otherwise reads and never answers.
class FakeGateway {
 public:
  FakeGateway() {
    char dir[] = "/tmp/strait-listen-test-XXXXXX";
    EXPECT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/straitd.sock";
    server_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof(a.sun_path) - 1);
    EXPECT_EQ(bind(server_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(server_, 64), 0);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~FakeGateway() {
    stop_ = true;
    shutdown(server_, SHUT_RDWR);
    acceptor_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& t : conns_) t.join();
    for (int fd : fds_) close(fd);
    close(server_);
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  FakeGateway(const FakeGateway&) = delete;
  FakeGateway& operator=(const FakeGateway&) = delete;

  const std::string& path() const { return path_; }
  void set_answering(bool on) { answering_ = on; }
  // Listen ids handed out so far.
  std::set<uint64_t> listen_ids() {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_;
  }

 private:
  void AcceptLoop() {
    for (;;) {
      const int fd = accept4(server_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0 || stop_) {
        if (fd >= 0) close(fd);
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(fd);
      conns_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  void Serve(int fd) {
    for (;;) {
      unsigned char len4[4];
      if (!ReadFull(fd, len4, 4)) return;
      const uint32_t len = static_cast<uint32_t>(len4[0]) | (len4[1] << 8) | (len4[2] << 16) |
                           (static_cast<uint32_t>(len4[3]) << 24);
      if (len == 0 || len > (1u << 20)) return;
      std::vector<uint8_t> body(len);
      if (!ReadFull(fd, body.data(), len)) return;
      if (!answering_) continue;  // a hung gateway: reads, never answers
      StatusOr<localproto::Message> m = localproto::DecodeMessage(std::span<const uint8_t>(body));
      if (!m.ok()) return;
      localproto::Message reply;
      reply.type = localproto::MessageType::kReply;
      reply.reply_to = m->type;
      reply.code = StatusCode::kOk;
      if (m->type == localproto::MessageType::kTunnelListen) {
        localproto::TunnelEvent e;
        e.kind = localproto::TunnelEventKind::kListening;
        e.shard = 3;
        e.region = "a";
        {
          std::lock_guard<std::mutex> lock(mu_);
          e.id = next_id_++;
          ids_.insert(e.id);
        }
        reply.data = localproto::EncodeTunnelEvent(e);
      } else if (m->type != localproto::MessageType::kHello) {
        return;
      }
      StatusOr<std::vector<uint8_t>> frame = localproto::EncodeMessage(reply);
      if (!frame.ok() || !WriteFull(fd, *frame)) return;
    }
  }

  std::string dir_;
  std::string path_;
  int server_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> answering_{true};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> conns_;
  std::set<uint64_t> ids_;
  uint64_t next_id_ = 1000;
};

// Polls `cond` for up to 30 s (the pool fills in the background).
template <typename F>
bool Eventually(F cond) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

TEST(TransportListenPool, ListenPublishesAPreOpenedTunnelListenWithoutAskingTheGateway) {
  FakeGateway gw;
  Transport& t = Transport::Get();
  ASSERT_TRUE(t.Init(Env({{"STRAIT_GATEWAY", gw.path()}, {"STRAIT_REGION", "a"}}), nullptr).ok());
  unsigned char h1[128] = {};
  StatusOr<void*> l1 = t.Listen(0, h1);
  ASSERT_TRUE(l1.ok()) << l1.status();
  StatusOr<ListenHandle> d1 = DecodeHandle(h1);
  ASSERT_TRUE(d1.ok()) << d1.status();
  EXPECT_TRUE(d1->tunnel);
  EXPECT_EQ(d1->region, "a");
  EXPECT_EQ(d1->gateway_shard, 3u);
  EXPECT_EQ(gw.listen_ids().count(d1->listen_id), 1u);

  // Once the pool is full again, the gateway stops answering (hung): listen still returns a
  // handle, from a listener opened before the hang. Waiting on the gateway would fail instead.
  ASSERT_TRUE(Eventually([&] { return gw.listen_ids().size() >= 5; }))
      << gw.listen_ids().size() << " tunnel listens answered";
  gw.set_answering(false);
  std::set<uint64_t> published = {d1->listen_id};
  std::vector<void*> comms = {*l1};
  for (int i = 0; i < 3; ++i) {
    unsigned char h[128] = {};
    StatusOr<void*> l = t.Listen(0, h);
    ASSERT_TRUE(l.ok()) << "listen " << i << " with the gateway hung: " << l.status();
    comms.push_back(*l);
    StatusOr<ListenHandle> d = DecodeHandle(h);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->tunnel);
    EXPECT_EQ(gw.listen_ids().count(d->listen_id), 1u);
    EXPECT_TRUE(published.insert(d->listen_id).second) << "listen id " << d->listen_id << " twice";
    EXPECT_NE(d->nonce, d1->nonce);
  }
  for (void* c : comms) EXPECT_TRUE(t.CloseListen(c).ok());
  t.Finalize();
}

TEST(TransportListenPool, AHungGatewayFailsListenWithinTheBoundNamingIt) {
  FakeGateway gw;
  gw.set_answering(false);
  Transport& t = Transport::Get();
  ASSERT_TRUE(t.Init(Env({{"STRAIT_GATEWAY", gw.path()}, {"STRAIT_REGION", "a"}}), nullptr).ok());
  unsigned char handle[128] = {};
  const auto start = std::chrono::steady_clock::now();
  StatusOr<void*> listen = t.Listen(0, handle);
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(listen.ok());
  EXPECT_EQ(listen.status().code(), StatusCode::kDeadlineExceeded) << listen.status();
  EXPECT_NE(listen.status().message().find(gw.path()), std::string::npos) << listen.status();
  EXPECT_NE(listen.status().message().find("did not answer"), std::string::npos) << listen.status();
  // The bound (kGatewayListenWaitNs), not the 10 s listen used to wait: a deadline, with room
  // for a loaded machine.
  EXPECT_LT(waited, std::chrono::nanoseconds(kGatewayListenWaitNs) + std::chrono::seconds(5));
  t.Finalize();
}

TEST(TransportListenPool, AGatewayThatComesUpAfterInitIsUsed) {
  char dir[] = "/tmp/strait-listen-late-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  // Init while nothing listens at the path: the pre-opened listeners fail...
  const std::string missing = std::string(dir) + "/not-yet.sock";
  Transport& t = Transport::Get();
  ASSERT_TRUE(t.Init(Env({{"STRAIT_GATEWAY", missing}, {"STRAIT_REGION", "a"}}), nullptr).ok());
  unsigned char handle[128] = {};
  StatusOr<void*> listen = t.Listen(0, handle);
  ASSERT_FALSE(listen.ok());
  EXPECT_EQ(listen.status().code(), StatusCode::kUnavailable) << listen.status();
  EXPECT_NE(listen.status().message().find(missing), std::string::npos) << listen.status();
  t.Finalize();
  rmdir(dir);
  // ...and a gateway that is there by the time of listen is found (a fresh attempt).
  FakeGateway gw;
  ASSERT_TRUE(t.Init(Env({{"STRAIT_GATEWAY", gw.path()}, {"STRAIT_REGION", "a"}}), nullptr).ok());
  listen = t.Listen(0, handle);
  ASSERT_TRUE(listen.ok()) << listen.status();
  EXPECT_TRUE(t.CloseListen(*listen).ok());
  t.Finalize();
}

TEST(TransportListenPool, AConnectThroughAHungGatewayEndsByItsDeadline) {
  FakeGateway gw;
  gw.set_answering(false);
  Transport& t = Transport::Get();
  ASSERT_TRUE(t.Init(Env({{"STRAIT_GATEWAY", gw.path()},
                          {"STRAIT_REGION", "b"},
                          {"STRAIT_CONNECT_TIMEOUT", "1s"}}),
                     nullptr)
                  .ok());
  // A handle from a rank in region a, as its listen() published it.
  ListenHandle peer;
  peer.nonce = 42;
  peer.region = "a";
  peer.tunnel = true;
  peer.gateway_shard = 0;
  peer.listen_id = 7;
  auto* in = reinterpret_cast<sockaddr_in*>(&peer.addr);
  in->sin_family = AF_INET;
  in->sin_port = htons(9);  // never dialled: the connection goes through the gateway
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  unsigned char handle[128] = {};
  ASSERT_TRUE(EncodeHandle(peer, handle).ok());
  int call_again = 0;
  Status result;
  for (int i = 0; i < 30000; ++i) {
    StatusOr<void*> c = t.Connect(0, handle);
    if (!c.ok()) {
      result = c.status();
      break;
    }
    ASSERT_EQ(*c, nullptr) << "connected through a gateway that never answered";
    ++call_again;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GT(call_again, 0);
  EXPECT_EQ(result.code(), StatusCode::kDeadlineExceeded) << result;
  EXPECT_NE(result.message().find("STRAIT_CONNECT_TIMEOUT"), std::string::npos) << result;
  t.Finalize();
}

}  // namespace
}  // namespace strait::nccl
