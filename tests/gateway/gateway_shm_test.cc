// The local path through shared memory (kAttachShm, kAllReduceShm; localproto/shm.h) against
// real gateways in this process: results equal to the socket path's, descriptors that point
// outside the region, what is not a sealed memfd, a region without its fd, and regions of
// closed and killed clients unmapped.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/endian.h"
#include "gateway_fixtures.h"
#include "localproto/frame_io.h"
#include "localproto/shm.h"

namespace strait::gateway {
namespace {

using localproto::Message;
using localproto::MessageType;

// Mappings of ranks' regions in this process (the gateways run here): /proc/self/maps lines of
// the memfd's name.
int MappedRegions() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find("/memfd:strait-local") != std::string::npos;
  }
  return n;
}

std::string StatsOf(Gateway& g) { return g.StatsText(); }

// A raw connection to a gateway, for requests the Client never makes.
class RawConnection {
 public:
  explicit RawConnection(const std::string& socket) {
    auto fd = localproto::Dial(socket, Deadline::AfterSeconds(5), "shm-test");
    EXPECT_TRUE(fd.ok()) << fd.status();
    fd_ = fd.ok() ? *fd : -1;
  }
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  // kAttachShm of `bytes`, then the byte carrying `pass` (-1: the byte without a descriptor).
  StatusOr<Message> Attach(uint64_t bytes, int pass) {
    Message m;
    m.type = MessageType::kAttachShm;
    m.shm_bytes = bytes;
    STRAIT_RETURN_IF_ERROR(localproto::WriteMessage(fd_, m, Deadline::AfterSeconds(5)));
    if (pass >= 0) {
      STRAIT_RETURN_IF_ERROR(localproto::SendFd(fd_, pass, Deadline::AfterSeconds(5)));
    } else {
      const uint8_t byte = 0;
      if (::send(fd_, &byte, 1, MSG_NOSIGNAL) != 1) return UnavailableError("send");
    }
    return localproto::ReadReply(fd_, MessageType::kAttachShm, Deadline::AfterSeconds(5));
  }
  // kAttachShm alone, its descriptor never sent.
  bool AttachWithoutTheFd(uint64_t bytes) {
    Message m;
    m.type = MessageType::kAttachShm;
    m.shm_bytes = bytes;
    return localproto::WriteMessage(fd_, m, Deadline::AfterSeconds(5)).ok();
  }
  StatusOr<Message> AllReduceShm(uint64_t offset, uint64_t count) {
    Message m;
    m.type = MessageType::kAllReduceShm;
    m.job = "job";
    m.tensor_key = "w";
    m.dtype = DataType::kFloat32;
    m.count = count;
    m.generation = 1;
    m.shm_offset = offset;
    STRAIT_RETURN_IF_ERROR(localproto::WriteMessage(fd_, m, Deadline::AfterSeconds(5)));
    return localproto::ReadReply(fd_, MessageType::kAllReduceShm, Deadline::AfterSeconds(5));
  }
  bool Serves() {
    Message m;
    m.type = MessageType::kStats;
    if (!localproto::WriteMessage(fd_, m, Deadline::AfterSeconds(5)).ok()) return false;
    auto r = localproto::ReadReply(fd_, MessageType::kStats, Deadline::AfterSeconds(5));
    return r.ok() && r->code == StatusCode::kOk;
  }

 private:
  int fd_ = -1;
};

// Every size, through a region on one side and the socket on the other: both sides get the
// exact sums, the shm side grows its region as tensors grow, and both regions pair with the
// socket side's operations (one operation identity for both paths).
TEST_F(GatewayPair, SharedRegionAndSocketGiveTheSameResults) {
  StartBoth();
  clients_[1]->UseSharedMemory(false);
  const std::vector<size_t> counts = {1, 20000, 100000, 7, 1 << 20, 16384, 3 << 19};
  for (size_t k = 0; k < counts.size(); ++k) {
    EXPECT_EQ(AllReduceBoth("t" + std::to_string(k), counts[k]), 0u) << "step " << k;
  }
  EXPECT_GE(clients_[0]->shared_region_bytes(), size_t{3 << 19} * sizeof(float));
  EXPECT_EQ(clients_[1]->shared_region_bytes(), 0u);
  EXPECT_NE(StatsOf(*gateway_).find("shm_regions 1\n"), std::string::npos) << StatsOf(*gateway_);
  EXPECT_NE(StatsOf(*eu_).find("shm_regions 0\n"), std::string::npos) << StatsOf(*eu_);
  // Both through regions.
  clients_[1]->UseSharedMemory(true);
  EXPECT_EQ(AllReduceBoth("both", 1 << 18), 0u);
  EXPECT_GT(clients_[1]->shared_region_bytes(), 0u);
  EXPECT_EQ(MappedRegions(), 4);  // each client's own mapping and its gateway's
}

// Zero-copy: the tensor written into the client's SharedBuffer is reduced there, paired with
// the socket side's operation; misuse is refused in one line before any step is used (the next
// call still works), and a client without shared memory is told to use AllReduce.
TEST_F(GatewayPair, ASharedBufferIsReducedInPlaceAndMisuseIsRefused) {
  StartBoth();
  clients_[1]->UseSharedMemory(false);
  const Deadline d = Deadline::AfterSeconds(20);
  EXPECT_EQ(clients_[1]->SharedBuffer(4096, d).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(clients_[0]->SharedBuffer(0, d).status().code(), StatusCode::kInvalidArgument);
  Status early = clients_[0]->AllReduceShared("job", "early", DataType::kFloat32, ReduceOp::kSum,
                                              16, d);
  EXPECT_EQ(early.code(), StatusCode::kFailedPrecondition) << early;
  EXPECT_NE(early.message().find("call SharedBuffer(64) first"), std::string::npos) << early;

  constexpr size_t kCount = 100'000;
  auto buffer = clients_[0]->SharedBuffer(kCount * sizeof(float), d);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  Status too_big = clients_[0]->AllReduceShared("job", "big", DataType::kFloat32, ReduceOp::kSum,
                                                (clients_[0]->shared_region_bytes() / 4) + 1, d);
  EXPECT_EQ(too_big.code(), StatusCode::kFailedPrecondition) << too_big;
  // A count whose byte size overflows is refused, not wrapped into a small one.
  EXPECT_EQ(clients_[0]->AllReduceShared("job", "wrap", DataType::kFloat32, ReduceOp::kSum,
                                         (SIZE_MAX / 4) + 2, d).code(),
            StatusCode::kInvalidArgument);
  for (int step = 0; step < 3; ++step) {
    float* mine = reinterpret_cast<float*>(buffer->data());
    std::vector<float> theirs(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      mine[i] = static_cast<float>(step + i % 7);
      theirs[i] = static_cast<float>(2 * step + i % 3);
    }
    Status other;
    std::thread t([&] {
      other = clients_[1]->AllReduce("job", "z" + std::to_string(step), DataType::kFloat32,
                                     ReduceOp::kSum, theirs.data(), kCount, d);
    });
    Status s = clients_[0]->AllReduceShared("job", "z" + std::to_string(step), DataType::kFloat32,
                                            ReduceOp::kSum, kCount, d);
    t.join();
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(other.ok()) << other;
    size_t wrong = 0;
    for (size_t i = 0; i < kCount; ++i) {
      const float want = static_cast<float>(3 * step + i % 7 + i % 3);
      wrong += mine[i] != want || theirs[i] != want;
    }
    EXPECT_EQ(wrong, 0u) << "step " << step;
  }
}

// A rank of another uid (allowed on the socket) that names a job it does not own is refused
// (kPermissionDenied, before the step is used): its region never receives that job's data, and
// the owner's all-reduces go on.
TEST_F(GatewayPair, AnotherUidsRegionNeverReceivesAJobItDoesNotOwn) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  config_.allowed_uids = {::getuid(), 65534};
  StartBoth();
  // The other uid keeps gid 0, so the group bits let it reach the socket.
  ASSERT_EQ(::chmod(dir_.c_str(), 0750), 0);
  EXPECT_EQ(AllReduceBoth("before", 1 << 16), 0u);  // the job has its owner and a step behind it
  StatusOr<Message> refused = UnavailableError("not run");
  std::vector<uint8_t> seen;
  // Another uid on this thread only (the raw syscall leaves the other threads alone);
  // SO_PEERCRED records it at connect, and its memfd is its own.
  std::thread other([&] {
    if (::syscall(SYS_setresuid, -1, 65534, -1) != 0) {
      refused = InternalError("setresuid failed");
      return;
    }
    RawConnection c(config_.local_socket);
    auto region = localproto::ShmRegion::Create(1 << 20);
    if (!region.ok()) {
      refused = region.status();
      return;
    }
    std::memset((*region)->data(), 0x5a, 1 << 20);
    auto attached = c.Attach(1 << 20, (*region)->fd());
    if (!attached.ok() || attached->code != StatusCode::kOk) {
      refused = attached.ok() ? Status(attached->code, attached->text) : attached.status();
      return;
    }
    refused = c.AllReduceShm(0, 1000);  // job "job", the owner's
    seen.assign((*region)->data(), (*region)->data() + 4000);
  });
  other.join();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->code, StatusCode::kPermissionDenied) << refused->text;
  EXPECT_NE(refused->text.find("uid 65534"), std::string::npos) << refused->text;
  EXPECT_EQ(refused->data, std::vector<uint8_t>{0});
  ASSERT_EQ(seen.size(), 4000u);
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 0x5a) << i;
  EXPECT_EQ(AllReduceBoth("after", 1 << 16), 0u);
}

// A descriptor that does not lie inside the connection's region is refused before anything is
// read or written there (refusal marker 0: the step is not used), and the connection goes on.
TEST_F(GatewayServer, DescriptorsOutsideTheRegionAreRefusedAndTouchNothing) {
  StartGateway();
  RawConnection c(config_.local_socket);
  auto region = localproto::ShmRegion::Create(4096);
  ASSERT_TRUE(region.ok()) << region.status();
  std::memset((*region)->data(), 0x5a, 4096);
  auto attached = c.Attach(4096, (*region)->fd());
  ASSERT_TRUE(attached.ok()) << attached.status();
  ASSERT_EQ(attached->code, StatusCode::kOk) << attached->text;
  const std::vector<std::pair<uint64_t, uint64_t>> outside = {
      {4092, 2}, {0, 1025}, {4096, 1}, {~uint64_t{0} - 3, 1}, {~uint64_t{0} / 2, 1u << 20}};
  for (const auto& [offset, count] : outside) {
    auto r = c.AllReduceShm(offset, count);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->code, StatusCode::kInvalidArgument) << offset << "+" << count;
    EXPECT_NE(r->text.find("outside the shared region of 4096 bytes"), std::string::npos)
        << r->text;
    EXPECT_EQ(r->data, std::vector<uint8_t>{0});  // refused: the step is not used
  }
  for (int i = 0; i < 4096; ++i) ASSERT_EQ((*region)->data()[i], 0x5a) << i;
  EXPECT_TRUE(c.Serves());
  EXPECT_NE(StatsOf(*gateway_).find("bad_requests 5\n"), std::string::npos) << StatsOf(*gateway_);
}

// Without a region, kAllReduceShm is refused; what is not a sealed memfd of the announced size
// is never mapped; each refusal leaves the connection serving.
TEST_F(GatewayServer, OnlySealedMemfdsOfTheAnnouncedSizeAreMapped) {
  StartGateway();
  RawConnection c(config_.local_socket);
  auto r = c.AllReduceShm(0, 16);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->code, StatusCode::kFailedPrecondition);
  EXPECT_NE(r->text.find("attach one first"), std::string::npos) << r->text;

  auto expect_refused = [&](StatusOr<Message> reply, const std::string& fragment) {
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->code, StatusCode::kInvalidArgument) << reply->text;
    EXPECT_NE(reply->text.find(fragment), std::string::npos) << reply->text;
    EXPECT_TRUE(c.Serves()) << fragment;
  };
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  expect_refused(c.Attach(4096, pipe_fds[0]), "not a memfd");
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);

  const int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(::ftruncate(unsealed, 4096), 0);
  expect_refused(c.Attach(4096, unsealed), "not sealed against shrinking");
  ::close(unsealed);

  auto small = localproto::ShmRegion::Create(4096);
  ASSERT_TRUE(small.ok());
  expect_refused(c.Attach(8192, (*small)->fd()), "fewer than the 8192 announced");
  expect_refused(c.Attach(0, (*small)->fd()), "a region of 0 bytes");
  expect_refused(c.Attach(localproto::kMaxShmBytes + 1, (*small)->fd()), "allowed 1..");
  expect_refused(c.Attach(4096, -1), "carried 0 descriptors");
  EXPECT_EQ(MappedRegions(), 1);  // `small`'s own mapping only
  EXPECT_NE(StatsOf(*gateway_).find("shm_regions 0\n"), std::string::npos) << StatsOf(*gateway_);
}

// A client that announces a region and never passes its memfd holds neither the gateway's
// shutdown (which closes it at once instead of after the 30 s I/O timeout) nor anyone else.
TEST_F(GatewayServer, AnAttachWithoutItsFdDoesNotHoldTheShutdown) {
  StartGateway();
  RawConnection c(config_.local_socket);
  ASSERT_TRUE(c.AttachWithoutTheFd(4096));
  RawConnection other(config_.local_socket);
  EXPECT_TRUE(other.Serves());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the gateway is waiting now
  const auto t0 = std::chrono::steady_clock::now();
  gateway_->Shutdown(Deadline::AfterSeconds(1));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

// A rank's region is unmapped when its connection ends: closed, or its process killed while it
// holds the region.
TEST_F(GatewayServer, RegionsOfClosedAndKilledRanksAreUnmapped) {
  StartGateway();
  const int before = MappedRegions();
  {
    RawConnection c(config_.local_socket);
    auto region = localproto::ShmRegion::Create(1 << 20);
    ASSERT_TRUE(region.ok());
    auto a = c.Attach(1 << 20, (*region)->fd());
    ASSERT_TRUE(a.ok() && a->code == StatusCode::kOk);
    EXPECT_EQ(MappedRegions(), before + 2);
    // Attaching again replaces the region: still one in the gateway.
    auto b = c.Attach(1 << 20, (*region)->fd());
    ASSERT_TRUE(b.ok() && b->code == StatusCode::kOk);
    EXPECT_NE(StatsOf(*gateway_).find("shm_regions 1\n"), std::string::npos);
  }
  auto wait_for = [&](int want) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (MappedRegions() != want && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return MappedRegions();
  };
  EXPECT_EQ(wait_for(before), before);

  // A child process attaches a region and is killed holding it (its connection ends without a
  // goodbye). The gateway's threads run here, so the child makes raw system calls only (no
  // allocation after fork): its frames are encoded before.
  Message hello;
  hello.client_name = "doomed-rank";
  Message attach;
  attach.type = MessageType::kAttachShm;
  attach.shm_bytes = 1 << 20;
  auto hello_frame = localproto::EncodeMessage(hello);
  auto attach_frame = localproto::EncodeMessage(attach);
  ASSERT_TRUE(hello_frame.ok() && attach_frame.ok());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, config_.local_socket.c_str(), sizeof(addr.sun_path) - 1);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) ::_exit(2);
    const int mem = ::memfd_create("strait-local", MFD_ALLOW_SEALING);
    if (mem < 0 || ::ftruncate(mem, 1 << 20) != 0 ||
        ::fcntl(mem, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
      ::_exit(3);
    }
    if (::write(sock, hello_frame->data(), hello_frame->size()) < 0 ||
        ::write(sock, attach_frame->data(), attach_frame->size()) < 0 ||
        !localproto::SendFd(sock, mem, Deadline::AfterSeconds(5)).ok()) {
      ::_exit(4);
    }
    const char ok = 'y';
    if (::write(ready[1], &ok, 1) != 1) ::_exit(5);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char got = 0;
  ASSERT_EQ(::read(ready[0], &got, 1), 1) << "the child could not attach";
  ::close(ready[0]);
  EXPECT_EQ(wait_for(before + 1), before + 1);  // the child's region, mapped in the gateway
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(wait_for(before), before);
  EXPECT_NE(StatsOf(*gateway_).find("shm_regions 0\n"), std::string::npos) << StatsOf(*gateway_);
}

}  // namespace
}  // namespace strait::gateway
