// Real links over loopback (127.0.0.1, ephemeral ports) doing their work: TLS pools carrying
// messages of many sizes on many channels in order, streams killed mid-transfer, pools shrunk
// and grown, pacing, one channel not waiting behind another, and closing (flushes, tells the
// peer, leaves no descriptor). Bad peers are in link_peers_test.cc. Every wait is bounded.
#include "net/link.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "tests/net/link_fixtures.h"

namespace strait::net {
namespace {

TEST_F(NetLink, TransfersMessagesOfEverySizeInOrderOnEveryChannel) {
  Server server;
  EndpointOptions server_options = Options("us", us_, {"eu"});
  server_options.link.congestion_control = "cubic";
  ASSERT_TRUE(server.Start(server_options).ok());
  Collector back;
  auto client = Dial(Options("eu", eu_, {"us"}), server.port, 4, back.Callback());
  ASSERT_TRUE(client.ok()) << client.status();
  std::shared_ptr<Link>& link = client->link;

  const std::vector<size_t> sizes = {0, 1, 1000, 65536, 65537, (3u << 20) + 7, 5, 0};
  std::map<uint32_t, std::vector<std::vector<uint8_t>>> expected;
  SendTracker sends;
  size_t total = 0;
  uint64_t bytes = 0;
  for (uint32_t channel = 0; channel < 3; ++channel) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<uint8_t> m = Pattern(sizes[(i + channel) % sizes.size()], channel * 100 + i);
      expected[channel].push_back(m);
      bytes += m.size();
      link->Send(channel, std::move(m), Deadline::AfterSeconds(20), sends.Done());
      ++total;
    }
  }
  ASSERT_TRUE(server.received.WaitFor(total, 20));
  ASSERT_TRUE(sends.WaitFor(total, 20));
  for (const Status& s : sends.results()) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(server.received.messages(), expected);

  // The accepted side can send back on the same streams.
  std::shared_ptr<Link> accepted = server.link(0);
  ASSERT_NE(accepted, nullptr);
  EXPECT_EQ(accepted->peer_region(), "eu");
  ASSERT_TRUE(accepted->SendAndWait(7, Pattern(200000, 1), Deadline::AfterSeconds(10)).ok());
  ASSERT_TRUE(back.WaitFor(1, 10));
  EXPECT_EQ(back.messages()[7].at(0), Pattern(200000, 1));

  // Estimates are readable and consistent.
  ASSERT_TRUE(Eventually([&] { return link->Estimates().rtt_smoothed_ns > 0; }, 5));
  const LinkEstimates e = link->Estimates();
  EXPECT_EQ(e.bytes_acked, bytes);
  EXPECT_EQ(e.messages_sent, total);
  EXPECT_EQ(e.streams_up, 4);
  EXPECT_GT(e.rtt_min_ns, 0);
  EXPECT_LE(e.rtt_min_ns, e.rtt_smoothed_ns * 8);
  EXPECT_EQ(e.send_failures, 0u);
  EXPECT_EQ(server.endpoint->Counters().links_accepted, 1u);
  EXPECT_EQ(accepted->Estimates().messages_delivered, total);
}

TEST_F(NetLink, KilledStreamsStillDeliverIntactExactlyOnce) {
  Server server;
  // A slow consumer keeps chunks unacknowledged, so killed streams certainly carry some.
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"}), std::chrono::milliseconds(5)).ok());
  EndpointOptions options = Options("eu", eu_, {"us"});
  options.link.chunk_bytes = 32 * 1024;
  options.link.max_inflight_per_stream = 512 * 1024;
  auto client = Dial(options, server.port);
  ASSERT_TRUE(client.ok()) << client.status();
  std::shared_ptr<Link>& link = client->link;

  constexpr int kMessages = 40;
  std::map<uint32_t, std::vector<std::vector<uint8_t>>> expected;
  SendTracker sends;
  for (int i = 0; i < kMessages; ++i) {
    std::vector<uint8_t> m = Pattern(300000 + i, 7 + i);
    expected[i % 2].push_back(m);
    link->Send(i % 2, std::move(m), Deadline::AfterSeconds(30), sends.Done());
  }
  // Kill streams on both sides while the transfer runs.
  for (int round = 0; round < 4; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    link->KillStreamForTest(round % 4);
    if (auto accepted = server.link(0)) accepted->KillStreamForTest((round + 2) % 4);
  }
  ASSERT_TRUE(sends.WaitFor(kMessages, 30));
  for (const Status& s : sends.results()) EXPECT_TRUE(s.ok()) << s;
  ASSERT_TRUE(server.received.WaitFor(kMessages, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // nothing extra arrives
  EXPECT_EQ(server.received.count(), static_cast<size_t>(kMessages));
  EXPECT_EQ(server.received.messages(), expected);
  const LinkEstimates e = link->Estimates();
  EXPECT_GE(e.stream_failures, 2u);
  EXPECT_GT(e.chunks_resent, 0u);
  // The pool is redialled back to full strength.
  EXPECT_TRUE(link->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());
}

TEST_F(NetLink, ShrinkingAndGrowingThePoolLosesAndResendsNothing) {
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
  EndpointOptions options = Options("eu", eu_, {"us"});
  options.link.adapt_streams = false;
  options.link.adapt_chunk = false;
  auto client = Dial(options, server.port);
  ASSERT_TRUE(client.ok()) << client.status();
  std::shared_ptr<Link>& link = client->link;

  constexpr int kMessages = 60;
  std::map<uint32_t, std::vector<std::vector<uint8_t>>> expected;
  SendTracker sends;
  auto send = [&](int i) {
    std::vector<uint8_t> m = Pattern(500000 + i, 50 + i);
    expected[i % 3].push_back(m);
    link->Send(i % 3, std::move(m), Deadline::AfterSeconds(30), sends.Done());
  };
  for (int i = 0; i < kMessages / 2; ++i) send(i);
  link->SetStreamsForTest(2);  // while chunks are in flight on every stream
  ASSERT_TRUE(Eventually([&] { return link->Estimates().streams_up == 2; }, 10));
  EXPECT_EQ(link->Estimates().streams_target, 2);
  for (int i = kMessages / 2; i < kMessages; ++i) send(i);
  link->SetStreamsForTest(4);
  ASSERT_TRUE(link->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());
  ASSERT_TRUE(sends.WaitFor(kMessages, 30));
  for (const Status& s : sends.results()) EXPECT_TRUE(s.ok()) << s;
  ASSERT_TRUE(server.received.WaitFor(kMessages, 10));
  EXPECT_EQ(server.received.messages(), expected);
  const LinkEstimates e = link->Estimates();
  EXPECT_EQ(e.stream_failures, 0u);
  EXPECT_EQ(e.chunks_resent, 0u);
  std::shared_ptr<Link> accepted = server.link(0);
  ASSERT_NE(accepted, nullptr);
  EXPECT_EQ(accepted->Estimates().stream_failures, 0u);
  EXPECT_EQ(accepted->Estimates().protocol_errors, 0u);
  EXPECT_EQ(accepted->Estimates().duplicate_chunks, 0u);
  EXPECT_EQ(server.endpoint->Counters().links_accepted, 1u);
}

// Pacing (LinkOptions::max_rate_bps, per peer in peer_max_rate_bps): every stream up gets an
// equal share as its kernel pacing rate, shared again when the pool changes, and the link then
// sends no faster: 1 MiB at 4 Mbit/s takes about 2 s where unpaced loopback takes milliseconds.
// Unpaced links, and links within the own region, report no cap.
TEST_F(NetLink, MaxRateIsSharedAmongTheStreamsAsTheirKernelPacingRate) {
  Server server;
  EndpointOptions server_options = Options("us", us_, {"eu"});
  server_options.link.peer_max_rate_bps["eu"] = 80'000'000;  // the link to eu: 10 MB/s
  ASSERT_TRUE(server.Start(server_options).ok());
  EndpointOptions options = Options("eu", eu_, {"us"});
  options.link.adapt_streams = false;
  options.link.adapt_chunk = false;
  options.link.max_rate_bps = 4'000'000;
  auto client = Dial(options, server.port);
  ASSERT_TRUE(client.ok()) << client.status();
  std::shared_ptr<Link>& link = client->link;
  // Four streams of 125,000 B/s each; then two of 250,000.
  EXPECT_TRUE(Eventually(
      [&] { return link->Estimates().max_pacing_bytes_per_s == 500'000; }, 5))
      << link->Estimates().max_pacing_bytes_per_s;
  std::shared_ptr<Link> accepted;
  ASSERT_TRUE(Eventually([&] { return (accepted = server.link(0)) != nullptr; }, 5));
  EXPECT_TRUE(Eventually(
      [&] { return accepted->Estimates().max_pacing_bytes_per_s == 10'000'000; }, 5))
      << accepted->Estimates().max_pacing_bytes_per_s;
  link->SetStreamsForTest(2);
  ASSERT_TRUE(Eventually([&] { return link->Estimates().streams_up == 2; }, 10));
  EXPECT_TRUE(Eventually(
      [&] { return link->Estimates().max_pacing_bytes_per_s == 500'000; }, 5))
      << link->Estimates().max_pacing_bytes_per_s;

  SendTracker sends;
  std::vector<uint8_t> m = Pattern(1 << 20, 7);
  const std::vector<uint8_t> expected = m;
  Stopwatch took;
  link->Send(0, std::move(m), Deadline::AfterSeconds(30), sends.Done());
  ASSERT_TRUE(sends.WaitFor(1, 30));
  EXPECT_TRUE(sends.results()[0].ok()) << sends.results()[0];
  EXPECT_GE(took.ElapsedSeconds(), 1.5) << "1 MiB paced at 4 Mbit/s went faster than 5.6 Mbit/s";
  ASSERT_TRUE(server.received.WaitFor(1, 10));
  EXPECT_EQ(server.received.messages().at(0).at(0), expected);

  // Unpaced links report no cap.
  Server plain;
  ASSERT_TRUE(plain.Start(Options("us", us_, {"eu"})).ok());
  auto free_link = client->endpoint->Connect("us", "127.0.0.1", plain.port, nullptr);
  ASSERT_TRUE(free_link.ok());
  ASSERT_TRUE((*free_link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());
  std::shared_ptr<Link> free_accepted;
  ASSERT_TRUE(Eventually([&] { return (free_accepted = plain.link(0)) != nullptr; }, 5));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a few ticks
  EXPECT_EQ(free_accepted->Estimates().max_pacing_bytes_per_s, 0u);

  // max_rate_bps is about the WAN path: a link to a gateway of the own region (a region
  // all-reduce's, on the LAN) stays unpaced unless peer_max_rate_bps names the region.
  Server region;
  ASSERT_TRUE(region.Start(Options("us", us_, {"us"})).ok());
  EndpointOptions us_options = Options("us", us_, {"us"});
  us_options.link.max_rate_bps = 4'000'000;
  auto us_client = Endpoint::Create(us_options, nullptr);
  ASSERT_TRUE(us_client.ok());
  auto lan = (*us_client)->Connect("us", "127.0.0.1", region.port, nullptr);
  ASSERT_TRUE(lan.ok());
  ASSERT_TRUE((*lan)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ((*lan)->Estimates().max_pacing_bytes_per_s, 0u);
}

// Channels share the link chunk by chunk (SendBook's round-robin): a small message on another
// channel, sent just after a 48 MiB one, arrives long before it; with first-come first-cut it
// would wait behind all 48 MiB (one stream, so arrival order is cut order).
TEST_F(NetLink, ASmallMessageOnAnotherChannelDoesNotWaitBehindABigOne) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint32_t> order;
  EndpointOptions server_options = Options("us", us_, {"eu"});
  auto server = Endpoint::Create(server_options, [&](std::shared_ptr<Link>) {
    return MessageCallback([&](uint32_t channel, std::vector<uint8_t>) {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(channel);
      cv.notify_all();
    });
  });
  ASSERT_TRUE(server.ok()) << server.status();
  auto port = (*server)->Listen("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  EndpointOptions options = Options("eu", eu_, {"us"});
  options.link.streams = 1;
  options.link.adapt_streams = false;
  options.link.adapt_chunk = false;
  options.link.chunk_bytes = 64 * 1024;
  options.link.max_inflight_per_stream = 256 * 1024;
  auto client = Dial(options, *port, 1);
  ASSERT_TRUE(client.ok()) << client.status();
  std::shared_ptr<Link>& link = client->link;
  SendTracker sends;
  link->Send(16, Pattern(48u << 20, 1), Deadline::AfterSeconds(60), sends.Done());
  link->Send(17, Pattern(1000, 2), Deadline::AfterSeconds(60), sends.Done());
  ASSERT_TRUE(sends.WaitFor(2, 60));
  for (const Status& s : sends.results()) EXPECT_TRUE(s.ok()) << s;
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return order.size() == 2; }));
  EXPECT_EQ(order, (std::vector<uint32_t>{17, 16}));
  lock.unlock();
  client->endpoint.reset();
  server->reset();
}

TEST_F(NetLink, CloseFlushesWhatWasQueuedBeforeIt) {
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
  auto client = Dial(Options("eu", eu_, {"us"}), server.port, /*streams=*/0);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::shared_ptr<Link>& link = client->link;
  SendTracker sends;
  for (uint32_t i = 0; i < 4; ++i) {
    link->Send(i, Pattern(1 << 20, i), Deadline::AfterSeconds(10), sends.Done());
  }
  link->Close();  // before the streams are even up
  ASSERT_TRUE(sends.WaitFor(4, 10));
  for (const Status& s : sends.results()) EXPECT_TRUE(s.ok()) << s;
  ASSERT_TRUE(server.received.WaitFor(4, 5));
  EXPECT_EQ(server.received.messages()[3].at(0), Pattern(1 << 20, 3));
  EXPECT_EQ(link->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(5)).code(),
            StatusCode::kCancelled);
  std::shared_ptr<Link> accepted = server.link(0);
  ASSERT_NE(accepted, nullptr);
  EXPECT_EQ(accepted->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(5)).code(),
            StatusCode::kUnavailable);
}

TEST_F(NetLink, CloseFailsLaterSendsAndTellsThePeer) {
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
  auto client = Dial(Options("eu", eu_, {"us"}), server.port, /*streams=*/0);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::shared_ptr<Link>& link = client->link;
  ASSERT_TRUE(link->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(10)).ok());
  link->Close();
  EXPECT_EQ(link->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(5)).code(),
            StatusCode::kCancelled);
  std::shared_ptr<Link> accepted = server.link(0);
  ASSERT_NE(accepted, nullptr);
  const Status s = accepted->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(5));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_EQ(server.endpoint->Counters().links_accepted, 1u);  // no redial after a close
}

TEST_F(NetLink, EndpointShutdownTellsPeersSoThatTheyDoNotRedial) {
  auto server = std::make_unique<Server>();
  ASSERT_TRUE(server->Start(Options("us", us_, {"eu"})).ok());
  EndpointOptions options = Options("eu", eu_, {"us"});
  options.link.unreachable_after_ns = 30'000'000'000;  // what a peer would wait without a close
  auto client = Dial(options, server->port);
  ASSERT_TRUE(client.ok()) << client.status();
  std::shared_ptr<Link>& link = client->link;
  ASSERT_TRUE(link->SendAndWait(0, Pattern(1000, 1), Deadline::AfterSeconds(10)).ok());
  Stopwatch clock;
  server.reset();
  const Status s = link->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(10));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("closed the link"), std::string::npos) << s;
  EXPECT_LT(clock.ElapsedSeconds(), 3.0);
  EXPECT_EQ(link->Estimates().stream_failures, 0u) << "the streams closed, none failed";
}

// Open file descriptors of this process (sockets included).
size_t OpenFds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++n;
  }
  return n;
}

TEST_F(NetLink, CloseThenImmediateEndpointDestructionClosesEveryStream) {
  const size_t fds_before = OpenFds();
  {
    Server server;
    ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
    EndpointOptions options = Options("eu", eu_, {"us"});
    options.link.unreachable_after_ns = 30'000'000'000;  // what a peer would wait without a close
    auto client = Dial(options, server.port);
    ASSERT_TRUE(client.ok()) << client.status();
    std::shared_ptr<Link>& link = client->link;
    ASSERT_TRUE(link->SendAndWait(0, Pattern(1000, 1), Deadline::AfterSeconds(10)).ok());
    // Close() leaves the close records being written; the destructor must still see them out
    // and close the streams, not leave them to a StreamConn <-> LinkCore cycle.
    link->Close();
    client->endpoint.reset();
    link.reset();  // the last handle: the I/O context goes with it
    std::shared_ptr<Link> accepted = server.link(0);
    ASSERT_NE(accepted, nullptr);
    const Status s = accepted->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(5));
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
    EXPECT_NE(s.message().find("closed the link"), std::string::npos) << s;
    EXPECT_EQ(accepted->Estimates().stream_failures, 0u) << "a stream was reset, not closed";
    EXPECT_EQ(server.endpoint->Counters().links_accepted, 1u);
  }
  // Both endpoints and every handle are gone: so must be every socket.
  EXPECT_TRUE(Eventually([&] { return OpenFds() <= fds_before; }, 5))
      << OpenFds() - fds_before << " descriptors leaked";
}

TEST_F(NetLink, LinkOutlivingItsEndpointFailsCleanly) {
  auto client = Endpoint::Create(Options("eu", eu_, {"us"}), nullptr);
  ASSERT_TRUE(client.ok());
  auto link = (*client)->Connect("us", "127.0.0.1", 9, nullptr);
  ASSERT_TRUE(link.ok());
  client->reset();
  EXPECT_EQ((*link)->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(5)).code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace strait::net
