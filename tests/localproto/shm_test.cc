// Shared regions (localproto/shm.h) and their two wire messages: round trips and limits of
// kAttachShm and kAllReduceShm, slices that must stay inside the region, what Adopt refuses,
// and passing exactly one memfd over a socket pair.
#include "localproto/shm.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "localproto/protocol.h"

namespace strait::localproto {
namespace {

std::vector<uint8_t> Body(const std::vector<uint8_t>& frame) {
  return std::vector<uint8_t>(frame.begin() + 4, frame.end());
}

TEST(SharedMemoryProtocol, AttachAndDescriptorRoundTripWithoutData) {
  Message attach;
  attach.type = MessageType::kAttachShm;
  attach.shm_bytes = 12345;
  auto f = EncodeMessage(attach);
  ASSERT_TRUE(f.ok()) << f.status();
  auto a = DecodeMessage(Body(*f));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->type, MessageType::kAttachShm);
  EXPECT_EQ(a->shm_bytes, 12345u);

  Message d;
  d.type = MessageType::kAllReduceShm;
  d.job = "job";
  d.tensor_key = "layer.1";
  d.dtype = DataType::kBfloat16;
  d.op = ReduceOp::kAvg;
  d.count = 1000;
  d.generation = 3;
  d.sequence = 9;
  d.shm_offset = 4096;
  f = EncodeMessage(d);
  ASSERT_TRUE(f.ok()) << f.status();
  auto b = DecodeMessage(Body(*f));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->type, MessageType::kAllReduceShm);
  EXPECT_EQ(b->dtype, DataType::kBfloat16);
  EXPECT_EQ(b->op, ReduceOp::kAvg);
  EXPECT_EQ(b->count, 1000u);
  EXPECT_EQ(b->sequence, 9u);
  EXPECT_EQ(b->shm_offset, 4096u);
  EXPECT_TRUE(b->data.empty());
  EXPECT_TRUE(b->shm_data.empty());  // filled in by the gateway, never from the wire

  // A descriptor carries no data; trailing bytes, and counts beyond the largest region, are
  // refused on both sides.
  std::vector<uint8_t> body = Body(*f);
  body.push_back(0);
  EXPECT_EQ(DecodeMessage(body).status().code(), StatusCode::kInvalidArgument);
  d.count = kMaxShmBytes / 2 + 1;  // bf16: one element over
  EXPECT_EQ(EncodeMessage(d).status().code(), StatusCode::kInvalidArgument);
  d.count = 1;
  f = EncodeMessage(d);
  ASSERT_TRUE(f.ok());
  body = Body(*f);
  // count sits after type, job, key, dtype and op: 1 + (2 + 3) + (2 + 7) + 1 + 1.
  const size_t count_at = 17;
  for (int i = 0; i < 8; ++i) body[count_at + static_cast<size_t>(i)] = 0xff;
  auto huge = DecodeMessage(body);
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument) << huge.status();
  EXPECT_NE(huge.status().message().find("larger than a shared region"), std::string::npos)
      << huge.status();
}

TEST(SharedMemoryRegion, SlicesStayInsideTheRegion) {
  auto r = ShmRegion::Create(4096);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->size(), 4096u);
  auto whole = (*r)->Slice(0, 4096);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->data(), (*r)->data());
  EXPECT_TRUE((*r)->Slice(4096, 0).ok());
  for (const auto& [offset, bytes] : std::vector<std::pair<uint64_t, uint64_t>>{
           {4096, 1}, {0, 4097}, {1, 4096}, {~uint64_t{0}, 2}, {2, ~uint64_t{0}}}) {
    auto s = (*r)->Slice(offset, bytes);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << offset << "+" << bytes;
  }
  EXPECT_EQ(ShmRegion::Create(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Create(kMaxShmBytes + 1).status().code(), StatusCode::kInvalidArgument);
  // Sealed: the region cannot shrink (or grow) under whoever maps it.
  EXPECT_NE(::ftruncate((*r)->fd(), 0), 0);
  EXPECT_NE(::ftruncate((*r)->fd(), 8192), 0);
}

TEST(SharedMemoryRegion, AdoptMapsTheSamePagesAndRefusesTheRest) {
  auto made = ShmRegion::Create(8192);
  ASSERT_TRUE(made.ok());
  auto adopted = ShmRegion::Adopt(::dup((*made)->fd()), 8192);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  (*made)->data()[100] = 42;
  EXPECT_EQ((*adopted)->data()[100], 42);  // one set of pages, two mappings

  const int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(::ftruncate(unsealed, 8192), 0);
  auto s = ShmRegion::Adopt(unsealed, 8192);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(::fcntl(unsealed, F_GETFD), 0) << "Adopt must close what it refuses";
  EXPECT_EQ(ShmRegion::Adopt(::dup((*made)->fd()), 8193).status().code(),
            StatusCode::kInvalidArgument);
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  auto n = ShmRegion::Adopt(devnull, 8192);
  EXPECT_NE(n.status().message().find("not a memfd"), std::string::npos) << n.status();
}

TEST(SharedMemoryFd, ExactlyOneDescriptorPassesAndAnythingElseIsRefused) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  auto r = ShmRegion::Create(4096);
  ASSERT_TRUE(r.ok());
  auto none = ReceiveFd(sv[1]);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, -1);  // nothing sent yet: wait
  ASSERT_TRUE(SendFd(sv[0], (*r)->fd(), Deadline::AfterSeconds(5)).ok());
  auto fd = ReceiveFd(sv[1]);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_GE(*fd, 0);
  EXPECT_NE(*fd, (*r)->fd());
  EXPECT_EQ(::fcntl(*fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  auto adopted = ShmRegion::Adopt(*fd, 4096);
  ASSERT_TRUE(adopted.ok()) << adopted.status();

  // The byte alone: refused, naming what was missing.
  const uint8_t byte = 0;
  ASSERT_EQ(::send(sv[0], &byte, 1, 0), 1);
  auto bare = ReceiveFd(sv[1]);
  EXPECT_EQ(bare.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bare.status().message().find("carried 0 descriptors"), std::string::npos);

  // Two descriptors with the byte: refused, and both closed here.
  const int two[2] = {(*r)->fd(), (*r)->fd()};
  ASSERT_TRUE(SendFds(sv[0], two, Deadline::AfterSeconds(5)).ok());
  auto many = ReceiveFd(sv[1]);
  EXPECT_EQ(many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(many.status().message().find("carried 2 descriptors"), std::string::npos);

  EXPECT_EQ(SendFds(sv[0], {}, Deadline::AfterSeconds(5)).code(), StatusCode::kInvalidArgument);
  ::close(sv[0]);
  auto gone = ReceiveFd(sv[1]);
  EXPECT_EQ(gone.status().code(), StatusCode::kUnavailable);
  ::close(sv[1]);
}

}  // namespace
}  // namespace strait::localproto
