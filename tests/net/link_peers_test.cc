// Real links over loopback refusing what they must: certificates of another CA, unknown
// regions, garbage and other wire versions, a peer over the partial-message budget or with
// overlapping chunks, plain TCP against TLS, unreachable peers, bad configuration; and the log rate of refusals and redials.
// Good peers on the same listener are unharmed. Every wait is bounded.
#include "net/link.h"

#include <gtest/gtest.h>

#include <mutex>
#include <string_view>
#include <vector>

#include "common/log.h"
#include "net/wire.h"
#include "tests/net/link_fixtures.h"

namespace strait::net {
namespace {

TEST_F(NetLink, CertificateFromAnotherCaIsRefused) {
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
  // The rogue gateway trusts the cluster CA (so it accepts the server) but its own
  // certificate comes from another CA.
  EndpointOptions rogue = Options("eu", rogue_eu_, {"us"});
  rogue.ca_file = us_.ca;
  rogue.link.unreachable_after_ns = 500'000'000;
  auto client = Endpoint::Create(rogue, nullptr);
  ASSERT_TRUE(client.ok()) << client.status();
  auto link = (*client)->Connect("us", "127.0.0.1", server.port, nullptr);
  ASSERT_TRUE(link.ok());
  const Status s = (*link)->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(5));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("region us"), std::string::npos) << s;
  const EndpointCounters c = server.endpoint->Counters();
  EXPECT_GE(c.tls_handshake_failures, 1u);
  EXPECT_EQ(c.links_accepted, 0u);
  EXPECT_EQ(server.received.count(), 0u);
  EXPECT_TRUE((*link)->Estimates().unreachable);
}

// Issue 17: a refused peer retrying with backoff was logged at WARN on every retry. The first
// refusal from an address warns; the retries within the interval (10 s) only count.
TEST_F(NetLink, RefusedPeerRetryingIsWarnedOnceNotPerRetry) {
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
  std::mutex mu;
  int warnings = 0;
  SetLogSink([&](LogLevel level, std::string_view, std::string_view message) {
    if (level <= LogLevel::kWarn && message.find("refused stream") != std::string_view::npos) {
      std::lock_guard<std::mutex> lock(mu);
      ++warnings;
    }
  });
  EndpointOptions rogue = Options("eu", rogue_eu_, {"us"});
  rogue.ca_file = us_.ca;
  rogue.link.streams = 1;
  rogue.link.redial_initial_ns = 10'000'000;
  rogue.link.redial_max_ns = 20'000'000;
  rogue.link.unreachable_after_ns = 30'000'000'000;
  auto client = Endpoint::Create(rogue, nullptr);
  ASSERT_TRUE(client.ok()) << client.status();
  auto link = (*client)->Connect("us", "127.0.0.1", server.port, nullptr);
  ASSERT_TRUE(link.ok());
  EXPECT_TRUE(
      Eventually([&] { return server.endpoint->Counters().tls_handshake_failures >= 8; }, 10));
  client->reset();
  SetLogSink(nullptr);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(warnings, 1);
}

TEST_F(NetLink, UnknownRegionIsRefusedAndGoodPeersAreUnharmed) {
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
  auto good = Dial(Options("eu", eu_, {"us"}), server.port);
  ASSERT_TRUE(good.ok()) << good.status();
  std::shared_ptr<Link>& good_link = good->link;

  EndpointOptions stranger = Options("ap", ap_, {"us"});
  stranger.link.unreachable_after_ns = 400'000'000;
  auto bad = Endpoint::Create(stranger, nullptr);
  ASSERT_TRUE(bad.ok());
  auto bad_link = (*bad)->Connect("us", "127.0.0.1", server.port, nullptr);
  ASSERT_TRUE(bad_link.ok());
  EXPECT_FALSE((*bad_link)->WaitForStreams(1, Deadline::AfterSeconds(3)).ok());
  EXPECT_GE(server.endpoint->Counters().unknown_region, 1u);
  EXPECT_EQ(server.endpoint->Counters().links_accepted, 1u);
  EXPECT_TRUE(
      good_link->SendAndWait(1, Pattern(100000, 3), Deadline::AfterSeconds(10)).ok());
  ASSERT_TRUE(server.received.WaitFor(1, 5));
}

TEST_F(NetLink, GarbageAndWrongVersionAreClosedAndCounted) {
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
  auto good = Dial(Options("eu", eu_, {"us"}), server.port);
  ASSERT_TRUE(good.ok()) << good.status();
  std::shared_ptr<Link>& link = good->link;

  // Garbage instead of a TLS ClientHello.
  EXPECT_TRUE(RawPeerIsClosed(server.port, nullptr, Pattern(300, 5), 5));
  EXPECT_TRUE(Eventually([&] { return server.endpoint->Counters().tls_handshake_failures >= 1; },
                         5));
  // A valid certificate, then garbage where the hello belongs.
  EXPECT_TRUE(RawPeerIsClosed(server.port, &eu_, Pattern(64, 6), 5));
  EXPECT_TRUE(Eventually([&] { return server.endpoint->Counters().bad_magic >= 1; }, 5));
  // A valid certificate and a hello of another wire version.
  Hello hello;
  hello.version = kWireVersion + 41;
  hello.region = "eu";
  EXPECT_TRUE(RawPeerIsClosed(server.port, &eu_, EncodeHello(hello), 5));
  EXPECT_TRUE(Eventually([&] { return server.endpoint->Counters().bad_version >= 1; }, 5));

  EXPECT_EQ(server.endpoint->Counters().links_accepted, 1u);
  EXPECT_EQ(link->Estimates().streams_up, 4);
  EXPECT_TRUE(link->SendAndWait(0, Pattern(500000, 9), Deadline::AfterSeconds(10)).ok());
}

TEST_F(NetLink, PeerExceedingThePartialMessageBudgetIsAProtocolError) {
  Server server;
  EndpointOptions options = Options("us", us_, {"eu"});
  options.link.max_message_bytes = 1 << 20;
  options.link.max_partial_bytes = 2 << 20;
  ASSERT_TRUE(server.Start(options).ok());
  // A hello, then the first byte of three 1 MiB messages: the third would make 3 MiB held.
  Hello hello;
  hello.session_id = 77;
  hello.region = "eu";
  std::vector<uint8_t> bytes = EncodeHello(hello);
  for (uint64_t id = 0; id < 3; ++id) {
    AppendDataRecordHeaders(DataHeader{id, 0, id, 1 << 20, 0}, 1, &bytes);
    bytes.push_back(1);
  }
  EXPECT_TRUE(RawPeerIsClosed(server.port, &eu_, bytes, 5));
  std::shared_ptr<Link> accepted;
  ASSERT_TRUE(Eventually([&] { return (accepted = server.link(0)) != nullptr; }, 5));
  EXPECT_TRUE(Eventually([&] { return accepted->Estimates().protocol_errors == 1; }, 5));
  EXPECT_EQ(server.received.count(), 0u);
}

// Chunks whose bytes overlap, leaving a gap inside the message that their lengths add up over:
// the stream is closed as a protocol error and nothing is delivered (the receive book once took
// such a message as whole, with the gap's bytes zero).
TEST_F(NetLink, PeerWhoseChunksOverlapIsAProtocolErrorAndDeliversNothing) {
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
  Hello hello;
  hello.session_id = 78;
  hello.region = "eu";
  std::vector<uint8_t> bytes = EncodeHello(hello);
  const std::pair<uint64_t, uint32_t> chunks[] = {{0, 10}, {5, 10}, {20, 10}};
  uint64_t seq = 0;
  for (const auto& [offset, length] : chunks) {
    AppendDataRecordHeaders(DataHeader{seq++, 0, 0, 30, offset}, length, &bytes);
    bytes.insert(bytes.end(), length, 0x5A);
  }
  EXPECT_TRUE(RawPeerIsClosed(server.port, &eu_, bytes, 5));
  std::shared_ptr<Link> accepted;
  ASSERT_TRUE(Eventually([&] { return (accepted = server.link(0)) != nullptr; }, 5));
  EXPECT_TRUE(Eventually([&] { return accepted->Estimates().protocol_errors == 1; }, 5));
  EXPECT_EQ(server.received.count(), 0u);
}

TEST_F(NetLink, RedialFailuresWarnOnceThenLogAtDebug) {
  uint16_t port = 0;
  {
    Server s;
    ASSERT_TRUE(s.Start(Options("us", us_, {"eu"})).ok());
    port = s.port;
  }
  std::mutex mu;
  int warnings = 0;
  SetLogSink([&](LogLevel level, std::string_view, std::string_view message) {
    if (level == LogLevel::kWarn && message.find("dialing") != std::string_view::npos) {
      std::lock_guard<std::mutex> lock(mu);
      ++warnings;
    }
  });
  EndpointOptions options = Options("eu", eu_, {"us"});
  options.link.streams = 1;
  options.link.unreachable_after_ns = 10'000'000'000;
  auto client = Endpoint::Create(options, nullptr);
  ASSERT_TRUE(client.ok());
  auto link = (*client)->Connect("us", "127.0.0.1", port, nullptr);
  ASSERT_TRUE(link.ok());
  EXPECT_TRUE(Eventually([&] { return (*link)->Estimates().stream_failures >= 4; }, 5));
  client->reset();
  SetLogSink(nullptr);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(warnings, 1);
}

TEST_F(NetLink, PlainTcpWorksOnlyWhenConfiguredOnBothSides) {
  Server plain_server;
  ASSERT_TRUE(plain_server.Start(Options("us", us_, {"eu"}, Transport::kPlainTcp)).ok());
  auto plain = Endpoint::Create(Options("eu", eu_, {"us"}, Transport::kPlainTcp), nullptr);
  ASSERT_TRUE(plain.ok());
  auto link = (*plain)->Connect("us", "127.0.0.1", plain_server.port, nullptr);
  ASSERT_TRUE(link.ok());
  EXPECT_TRUE((*link)->SendAndWait(2, Pattern(1 << 20, 4), Deadline::AfterSeconds(10)).ok());
  ASSERT_TRUE(plain_server.received.WaitFor(1, 5));

  // A TLS dialer is refused by the plain listener ...
  EndpointOptions tls_options = Options("eu", eu_, {"us"});
  tls_options.link.unreachable_after_ns = 300'000'000;
  auto tls = Endpoint::Create(tls_options, nullptr);
  ASSERT_TRUE(tls.ok());
  auto tls_link = (*tls)->Connect("us", "127.0.0.1", plain_server.port, nullptr);
  ASSERT_TRUE(tls_link.ok());
  EXPECT_FALSE((*tls_link)->WaitForStreams(1, Deadline::AfterSeconds(2)).ok());
  EXPECT_GE(plain_server.endpoint->Counters().bad_magic, 1u);

  // ... and a plain dialer by a TLS listener.
  Server tls_server;
  ASSERT_TRUE(tls_server.Start(Options("us", us_, {"eu"})).ok());
  auto plain_link = (*plain)->Connect("us", "127.0.0.1", tls_server.port, nullptr);
  ASSERT_TRUE(plain_link.ok());
  EXPECT_TRUE(Eventually(
      [&] { return tls_server.endpoint->Counters().tls_handshake_failures >= 1; }, 5));
  EXPECT_EQ(tls_server.endpoint->Counters().links_accepted, 0u);
}

TEST_F(NetLink, UnreachablePeerFailsSendsByDeadlineThenUnavailable) {
  // Reserve a port and close it again so that nothing listens there.
  uint16_t port = 0;
  {
    Server s;
    ASSERT_TRUE(s.Start(Options("us", us_, {"eu"})).ok());
    port = s.port;
  }
  EndpointOptions options = Options("eu", eu_, {"us"});
  options.link.unreachable_after_ns = 800'000'000;
  auto client = Endpoint::Create(options, nullptr);
  ASSERT_TRUE(client.ok());
  auto link = (*client)->Connect("us", "127.0.0.1", port, nullptr);
  ASSERT_TRUE(link.ok());
  Status s = (*link)->SendAndWait(0, Pattern(10, 1), Deadline::After(200'000'000));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  s = (*link)->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(5));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("unreachable"), std::string::npos) << s;
  EXPECT_NE(s.message().find("127.0.0.1:" + std::to_string(port)), std::string::npos) << s;
  EXPECT_GE((*link)->Estimates().stream_failures, 1u);
}

TEST_F(NetLink, CreateRefusesBadConfiguration) {
  EndpointOptions wrong_region = Options("ap", eu_, {"us"});
  auto e = Endpoint::Create(wrong_region, nullptr);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("names region 'eu'"), std::string::npos) << e.status();
  EndpointOptions cc = Options("eu", eu_, {"us"});
  cc.link.congestion_control = "no-such-cc";
  e = Endpoint::Create(cc, nullptr);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("no-such-cc"), std::string::npos) << e.status();
  EndpointOptions missing = Options("eu", eu_, {"us"});
  missing.key_file = "/nonexistent/key.pem";
  e = Endpoint::Create(missing, nullptr);
  EXPECT_NE(e.status().message().find("/nonexistent/key.pem"), std::string::npos) << e.status();
}

}  // namespace
}  // namespace strait::net
