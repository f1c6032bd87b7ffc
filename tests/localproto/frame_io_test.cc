// Tests of the local protocol's frame I/O (localproto/frame_io.h): reading a reply's head apart
// from its data, refusing replies out of step, and dialling straitd's socket.
#include "localproto/frame_io.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace strait::localproto {
namespace {

Message Reply(MessageType to, StatusCode code, std::string text, std::vector<uint8_t> data) {
  Message m;
  m.type = MessageType::kReply;
  m.reply_to = to;
  m.code = code;
  m.text = std::move(text);
  m.data = std::move(data);
  return m;
}

class SocketPair : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv_), 0); }
  void TearDown() override {
    ::close(sv_[0]);
    ::close(sv_[1]);
  }
  void Send(const Message& m) {
    ASSERT_TRUE(WriteMessage(sv_[0], m, Deadline::AfterSeconds(5)).ok());
  }
  int sv_[2] = {-1, -1};
};

TEST_F(SocketPair, ReplyHeadLeavesTheDataForTheCaller) {
  Send(Reply(MessageType::kAllReduce, StatusCode::kOk, "int8 shards=2,2", {1, 2, 3, 4}));
  Send(Reply(MessageType::kStats, StatusCode::kOk, "", {9}));
  size_t data_size = 0;
  auto head = ReadReplyHead(sv_[1], MessageType::kAllReduce, Deadline::AfterSeconds(5), &data_size);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->text, "int8 shards=2,2");
  EXPECT_TRUE(head->data.empty());
  ASSERT_EQ(data_size, 4u);
  uint8_t sink[4] = {};
  ASSERT_TRUE(ReadFrameBytes(sv_[1], sink, Deadline::AfterSeconds(5)).ok());
  EXPECT_EQ(sink[3], 4);
  // The next frame starts where the data ended.
  auto next = ReadReply(sv_[1], MessageType::kStats, Deadline::AfterSeconds(5));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->data, std::vector<uint8_t>{9});
}

TEST_F(SocketPair, AReplyToAnotherRequestIsOutOfStep) {
  Send(Reply(MessageType::kStats, StatusCode::kOk, "", {}));
  auto r = ReadReply(sv_[1], MessageType::kJoinJob, Deadline::AfterSeconds(5));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal) << r.status();
  EXPECT_NE(r.status().message().find("join-job"), std::string::npos) << r.status();
}

TEST_F(SocketPair, AnErrorReplyToAnotherTypeIsTheGatewaysReason) {
  // straitd answers a request it cannot frame as a hello, then drops the connection.
  Send(Reply(MessageType::kHello, StatusCode::kResourceExhausted, "frame too large", {}));
  size_t data_size = 0;
  auto r = ReadReplyHead(sv_[1], MessageType::kRegionAllReduce, Deadline::AfterSeconds(5),
                         &data_size);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("frame too large"), std::string::npos) << r.status();
}

TEST_F(SocketPair, ARequestWhereAReplyWasDueIsRefused) {
  Message hello;
  hello.type = MessageType::kHello;
  Send(hello);
  EXPECT_EQ(ReadReply(sv_[1], MessageType::kHello, Deadline::AfterSeconds(5)).status().code(),
            StatusCode::kInternal);
}

TEST_F(SocketPair, AShortReplyIsDecodedForItsError) {
  const uint8_t frame[] = {2, 0, 0, 0, static_cast<uint8_t>(MessageType::kReply), 3};
  ASSERT_TRUE(WriteAll(sv_[0], frame, Deadline::AfterSeconds(5)).ok());
  size_t data_size = 0;
  auto r = ReadReplyHead(sv_[1], MessageType::kStats, Deadline::AfterSeconds(5), &data_size);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
}

// A one-connection stand-in for straitd: answers the hello with `code`.
class FakeGateway {
 public:
  explicit FakeGateway(StatusCode code) {
    path_ = "/tmp/strait-localproto-" + std::to_string(::getpid()) + ".sock";
    ::unlink(path_.c_str());
    listener_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listener_, 1), 0);
    thread_ = std::thread([this, code] {
      const int c = ::accept(listener_, nullptr, nullptr);
      if (c < 0) return;
      auto body = ReadFrame(c, kDefaultMaxMessageBytes, Deadline::AfterSeconds(5));
      auto hello = body.ok() ? DecodeMessage(*body) : StatusOr<Message>(body.status());
      if (hello.ok()) client_name_ = hello->client_name;
      WriteMessage(c, Reply(MessageType::kHello, code, "no", {}), Deadline::AfterSeconds(5))
          .IgnoreError();
      ::close(c);
    });
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  ~FakeGateway() {
    Join();
    ::close(listener_);
    ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  const std::string& client_name() const { return client_name_; }

 private:
  std::string path_;
  int listener_ = -1;
  std::string client_name_;
  std::thread thread_;
};

TEST(Dial, ExchangesHellos) {
  FakeGateway gateway(StatusCode::kOk);
  auto fd = Dial(gateway.path(), Deadline::AfterSeconds(5), "tester");
  ASSERT_TRUE(fd.ok()) << fd.status();
  ::close(*fd);
  gateway.Join();
  EXPECT_EQ(gateway.client_name(), "tester");
}

TEST(Dial, ARefusedHelloIsTheGatewaysCode) {
  FakeGateway gateway(StatusCode::kUnimplemented);
  auto fd = Dial(gateway.path(), Deadline::AfterSeconds(5), "tester");
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kUnimplemented) << fd.status();
}

TEST(Dial, NoGatewayFailsAtOnceUnlessAskedToWait) {
  const std::string missing = "/tmp/strait-localproto-missing-" + std::to_string(::getpid());
  const auto start = std::chrono::steady_clock::now();
  auto fd = Dial(missing, Deadline::AfterSeconds(5), "tester", /*wait_for_gateway=*/false);
  EXPECT_EQ(fd.status().code(), StatusCode::kUnavailable) << fd.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  // Waiting retries until the deadline.
  auto waited = Dial(missing, Deadline::After(200'000'000), "tester");
  EXPECT_EQ(waited.status().code(), StatusCode::kUnavailable);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(150));
  EXPECT_EQ(Dial(std::string(200, 'x'), Deadline::AfterSeconds(1), "t").status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strait::localproto
