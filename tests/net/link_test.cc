// Tests of real links over loopback (127.0.0.1, ephemeral ports): TLS pools transferring
// messages of many sizes on many channels, streams killed mid-transfer, bad peers (another CA,
// an unknown region, garbage, a wrong wire version), plain TCP only when configured, deadlines.
// Every wait is bounded.
#include "net/link.h"

#include <gtest/gtest.h>

#include <asio.hpp>
#include <asio/ssl.hpp>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "common/log.h"
#include "net/wire.h"
#include "tests/net/test_certs.h"

namespace strait::net {
namespace {

using testing::CertFiles;
using testing::TestPki;

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v[i] = static_cast<uint8_t>(x);
  }
  return v;
}

// Collects received messages per channel; waits with a deadline.
class Collector {
 public:
  MessageCallback Callback(std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    return [this, delay](uint32_t channel, std::vector<uint8_t> message) {
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      std::lock_guard<std::mutex> lock(mu_);
      messages_[channel].push_back(std::move(message));
      ++count_;
      cv_.notify_all();
    };
  }
  bool WaitFor(size_t n, double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return count_ >= n; });
  }
  std::map<uint32_t, std::vector<std::vector<uint8_t>>> messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return count_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint32_t, std::vector<std::vector<uint8_t>>> messages_;
  size_t count_ = 0;
};

// Counts send completions; waits with a deadline.
class SendTracker {
 public:
  SendDone Done() {
    return [this](Status s) {
      std::lock_guard<std::mutex> lock(mu_);
      results_.push_back(std::move(s));
      cv_.notify_all();
    };
  }
  bool WaitFor(size_t n, double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                        [&] { return results_.size() >= n; });
  }
  std::vector<Status> results() {
    std::lock_guard<std::mutex> lock(mu_);
    return results_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Status> results_;
};

template <typename Pred>
bool Eventually(Pred pred, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

class NetLink : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto pki = TestPki::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_.emplace(std::move(pki).value());
    ASSERT_TRUE(pki_->MakeCa("cluster-ca").ok());
    ASSERT_TRUE(pki_->MakeCa("other-ca").ok());
    auto make = [](const char* ca, const char* region, const char* stem) {
      auto files = pki_->MakeGateway(ca, region, stem);
      EXPECT_TRUE(files.ok()) << files.status();
      return files.ok() ? *files : CertFiles{};
    };
    us_ = make("cluster-ca", "us", "us");
    eu_ = make("cluster-ca", "eu", "eu");
    ap_ = make("cluster-ca", "ap", "ap");
    rogue_eu_ = make("other-ca", "eu", "rogue-eu");
  }
  static void TearDownTestSuite() { pki_.reset(); }

  static EndpointOptions Options(const std::string& region, const CertFiles& files,
                                 std::vector<std::string> peers,
                                 Transport transport = Transport::kTls) {
    EndpointOptions o;
    o.region = region;
    o.transport = transport;
    o.ca_file = files.ca;
    o.cert_file = files.cert;
    o.key_file = files.key;
    o.peer_regions = std::move(peers);
    o.link.streams = 4;
    o.link.chunk_bytes = 64 * 1024;
    o.link.handshake_timeout_ns = 2'000'000'000;
    o.link.redial_initial_ns = 10'000'000;
    o.link.redial_max_ns = 100'000'000;
    o.link.unreachable_after_ns = 3'000'000'000;
    o.link.ping_interval_ns = 50'000'000;
    return o;
  }

  static inline std::optional<TestPki> pki_;
  static inline CertFiles us_, eu_, ap_, rogue_eu_;
};

// A listening "us" endpoint that collects what accepted links receive.
struct Server {
  // The endpoint first: its I/O thread may still be delivering into `received` (a send
  // completes once acknowledged, which may be before the receive callback returned).
  ~Server() { endpoint.reset(); }

  std::unique_ptr<Endpoint> endpoint;
  uint16_t port = 0;
  Collector received;
  std::mutex mu;
  std::vector<std::shared_ptr<Link>> links;

  Status Start(EndpointOptions options, std::chrono::milliseconds delay = {}) {
    auto e = Endpoint::Create(std::move(options), [this, delay](std::shared_ptr<Link> link) {
      std::lock_guard<std::mutex> lock(mu);
      links.push_back(std::move(link));
      return received.Callback(delay);
    });
    if (!e.ok()) return e.status();
    endpoint = std::move(e).value();
    auto p = endpoint->Listen("127.0.0.1", 0);
    if (!p.ok()) return p.status();
    port = *p;
    return Status::Ok();
  }
  std::shared_ptr<Link> link(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    return i < links.size() ? links[i] : nullptr;
  }
};

// Opens a raw connection to the listener (TLS with `tls` when given), writes `bytes`, and
// reports whether the listener closed the connection within `seconds`.
bool RawPeerIsClosed(uint16_t port, const CertFiles* tls, const std::vector<uint8_t>& bytes,
                     double seconds) {
  asio::io_context io;
  asio::ip::tcp::endpoint at(asio::ip::make_address("127.0.0.1"), port);
  asio::error_code ec;
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  std::optional<asio::ssl::stream<asio::ip::tcp::socket>> ssl;
  std::optional<asio::ip::tcp::socket> plain;
  if (tls != nullptr) {
    ctx.load_verify_file(tls->ca, ec);
    ctx.use_certificate_chain_file(tls->cert, ec);
    ctx.use_private_key_file(tls->key, asio::ssl::context::pem, ec);
    if (ec) return false;
    ssl.emplace(io, ctx);
    ssl->next_layer().connect(at, ec);
    if (ec) return false;
    ssl->handshake(asio::ssl::stream_base::client, ec);
    if (ec) return true;  // refused during the handshake
    asio::write(*ssl, asio::buffer(bytes), ec);
  } else {
    plain.emplace(io);
    plain->connect(at, ec);
    if (ec) return false;
    asio::write(*plain, asio::buffer(bytes), ec);
  }
  // Reads (the listener's hello, if any) until the connection fails or the time is up.
  bool closed = false;
  std::array<uint8_t, 256> buf;
  std::function<void(const asio::error_code&, size_t)> on_read;
  auto read_more = [&] {
    if (ssl) {
      ssl->async_read_some(asio::buffer(buf), on_read);
    } else {
      plain->async_read_some(asio::buffer(buf), on_read);
    }
  };
  on_read = [&](const asio::error_code& rec, size_t) {
    if (rec) {
      closed = true;
    } else {
      read_more();
    }
  };
  read_more();
  io.run_for(std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(seconds)));
  return closed;
}

TEST_F(NetLink, TransfersMessagesOfEverySizeInOrderOnEveryChannel) {
  Server server;
  EndpointOptions server_options = Options("us", us_, {"eu"});
  server_options.link.congestion_control = "cubic";
  ASSERT_TRUE(server.Start(server_options).ok());
  auto client = Endpoint::Create(Options("eu", eu_, {"us"}), nullptr);
  ASSERT_TRUE(client.ok()) << client.status();
  Collector back;
  auto link = (*client)->Connect("us", "127.0.0.1", server.port, back.Callback());
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE((*link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());

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
      (*link)->Send(channel, std::move(m), Deadline::AfterSeconds(20), sends.Done());
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
  ASSERT_TRUE(Eventually([&] { return (*link)->Estimates().rtt_smoothed_ns > 0; }, 5));
  const LinkEstimates e = (*link)->Estimates();
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
  auto client = Endpoint::Create(options, nullptr);
  ASSERT_TRUE(client.ok()) << client.status();
  auto link = (*client)->Connect("us", "127.0.0.1", server.port, nullptr);
  ASSERT_TRUE(link.ok());
  ASSERT_TRUE((*link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());

  constexpr int kMessages = 40;
  std::map<uint32_t, std::vector<std::vector<uint8_t>>> expected;
  SendTracker sends;
  for (int i = 0; i < kMessages; ++i) {
    std::vector<uint8_t> m = Pattern(300000 + i, 7 + i);
    expected[i % 2].push_back(m);
    (*link)->Send(i % 2, std::move(m), Deadline::AfterSeconds(30), sends.Done());
  }
  // Kill streams on both sides while the transfer runs.
  for (int round = 0; round < 4; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    (*link)->KillStreamForTest(round % 4);
    if (auto accepted = server.link(0)) accepted->KillStreamForTest((round + 2) % 4);
  }
  ASSERT_TRUE(sends.WaitFor(kMessages, 30));
  for (const Status& s : sends.results()) EXPECT_TRUE(s.ok()) << s;
  ASSERT_TRUE(server.received.WaitFor(kMessages, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // nothing extra arrives
  EXPECT_EQ(server.received.count(), static_cast<size_t>(kMessages));
  EXPECT_EQ(server.received.messages(), expected);
  const LinkEstimates e = (*link)->Estimates();
  EXPECT_GE(e.stream_failures, 2u);
  EXPECT_GT(e.chunks_resent, 0u);
  // The pool is redialled back to full strength.
  EXPECT_TRUE((*link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());
}

TEST_F(NetLink, ShrinkingAndGrowingThePoolLosesAndResendsNothing) {
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
  EndpointOptions options = Options("eu", eu_, {"us"});
  options.link.adapt_streams = false;
  options.link.adapt_chunk = false;
  auto client = Endpoint::Create(options, nullptr);
  ASSERT_TRUE(client.ok());
  auto link = (*client)->Connect("us", "127.0.0.1", server.port, nullptr);
  ASSERT_TRUE(link.ok());
  ASSERT_TRUE((*link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());

  constexpr int kMessages = 60;
  std::map<uint32_t, std::vector<std::vector<uint8_t>>> expected;
  SendTracker sends;
  auto send = [&](int i) {
    std::vector<uint8_t> m = Pattern(500000 + i, 50 + i);
    expected[i % 3].push_back(m);
    (*link)->Send(i % 3, std::move(m), Deadline::AfterSeconds(30), sends.Done());
  };
  for (int i = 0; i < kMessages / 2; ++i) send(i);
  (*link)->SetStreamsForTest(2);  // while chunks are in flight on every stream
  ASSERT_TRUE(Eventually([&] { return (*link)->Estimates().streams_up == 2; }, 10));
  EXPECT_EQ((*link)->Estimates().streams_target, 2);
  for (int i = kMessages / 2; i < kMessages; ++i) send(i);
  (*link)->SetStreamsForTest(4);
  ASSERT_TRUE((*link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());
  ASSERT_TRUE(sends.WaitFor(kMessages, 30));
  for (const Status& s : sends.results()) EXPECT_TRUE(s.ok()) << s;
  ASSERT_TRUE(server.received.WaitFor(kMessages, 10));
  EXPECT_EQ(server.received.messages(), expected);
  const LinkEstimates e = (*link)->Estimates();
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
  auto client = Endpoint::Create(options, nullptr);
  ASSERT_TRUE(client.ok());
  auto link = (*client)->Connect("us", "127.0.0.1", server.port, nullptr);
  ASSERT_TRUE(link.ok());
  ASSERT_TRUE((*link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());
  // Four streams of 125,000 B/s each; then two of 250,000.
  EXPECT_TRUE(Eventually(
      [&] { return (*link)->Estimates().max_pacing_bytes_per_s == 500'000; }, 5))
      << (*link)->Estimates().max_pacing_bytes_per_s;
  std::shared_ptr<Link> accepted;
  ASSERT_TRUE(Eventually([&] { return (accepted = server.link(0)) != nullptr; }, 5));
  EXPECT_TRUE(Eventually(
      [&] { return accepted->Estimates().max_pacing_bytes_per_s == 10'000'000; }, 5))
      << accepted->Estimates().max_pacing_bytes_per_s;
  (*link)->SetStreamsForTest(2);
  ASSERT_TRUE(Eventually([&] { return (*link)->Estimates().streams_up == 2; }, 10));
  EXPECT_TRUE(Eventually(
      [&] { return (*link)->Estimates().max_pacing_bytes_per_s == 500'000; }, 5))
      << (*link)->Estimates().max_pacing_bytes_per_s;

  SendTracker sends;
  std::vector<uint8_t> m = Pattern(1 << 20, 7);
  const std::vector<uint8_t> expected = m;
  Stopwatch took;
  (*link)->Send(0, std::move(m), Deadline::AfterSeconds(30), sends.Done());
  ASSERT_TRUE(sends.WaitFor(1, 30));
  EXPECT_TRUE(sends.results()[0].ok()) << sends.results()[0];
  EXPECT_GE(took.ElapsedSeconds(), 1.5) << "1 MiB paced at 4 Mbit/s went faster than 5.6 Mbit/s";
  ASSERT_TRUE(server.received.WaitFor(1, 10));
  EXPECT_EQ(server.received.messages().at(0).at(0), expected);

  // Unpaced links report no cap.
  Server plain;
  ASSERT_TRUE(plain.Start(Options("us", us_, {"eu"})).ok());
  auto free_link = (*client)->Connect("us", "127.0.0.1", plain.port, nullptr);
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
  auto good = Endpoint::Create(Options("eu", eu_, {"us"}), nullptr);
  ASSERT_TRUE(good.ok());
  auto good_link = (*good)->Connect("us", "127.0.0.1", server.port, nullptr);
  ASSERT_TRUE(good_link.ok());
  ASSERT_TRUE((*good_link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());

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
      (*good_link)->SendAndWait(1, Pattern(100000, 3), Deadline::AfterSeconds(10)).ok());
  ASSERT_TRUE(server.received.WaitFor(1, 5));
}

TEST_F(NetLink, GarbageAndWrongVersionAreClosedAndCounted) {
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
  auto good = Endpoint::Create(Options("eu", eu_, {"us"}), nullptr);
  ASSERT_TRUE(good.ok());
  auto link = (*good)->Connect("us", "127.0.0.1", server.port, nullptr);
  ASSERT_TRUE(link.ok());
  ASSERT_TRUE((*link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());

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
  EXPECT_EQ((*link)->Estimates().streams_up, 4);
  EXPECT_TRUE((*link)->SendAndWait(0, Pattern(500000, 9), Deadline::AfterSeconds(10)).ok());
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

TEST_F(NetLink, CloseFlushesWhatWasQueuedBeforeIt) {
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
  auto client = Endpoint::Create(Options("eu", eu_, {"us"}), nullptr);
  ASSERT_TRUE(client.ok());
  auto link = (*client)->Connect("us", "127.0.0.1", server.port, nullptr);
  ASSERT_TRUE(link.ok());
  SendTracker sends;
  for (uint32_t i = 0; i < 4; ++i) {
    (*link)->Send(i, Pattern(1 << 20, i), Deadline::AfterSeconds(10), sends.Done());
  }
  (*link)->Close();  // before the streams are even up
  ASSERT_TRUE(sends.WaitFor(4, 10));
  for (const Status& s : sends.results()) EXPECT_TRUE(s.ok()) << s;
  ASSERT_TRUE(server.received.WaitFor(4, 5));
  EXPECT_EQ(server.received.messages()[3].at(0), Pattern(1 << 20, 3));
  EXPECT_EQ((*link)->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(5)).code(),
            StatusCode::kCancelled);
  std::shared_ptr<Link> accepted = server.link(0);
  ASSERT_NE(accepted, nullptr);
  EXPECT_EQ(accepted->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(5)).code(),
            StatusCode::kUnavailable);
}

TEST_F(NetLink, EndpointShutdownTellsPeersSoThatTheyDoNotRedial) {
  auto server = std::make_unique<Server>();
  ASSERT_TRUE(server->Start(Options("us", us_, {"eu"})).ok());
  EndpointOptions options = Options("eu", eu_, {"us"});
  options.link.unreachable_after_ns = 30'000'000'000;  // what a peer would wait without a close
  auto client = Endpoint::Create(options, nullptr);
  ASSERT_TRUE(client.ok());
  auto link = (*client)->Connect("us", "127.0.0.1", server->port, nullptr);
  ASSERT_TRUE(link.ok());
  ASSERT_TRUE((*link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());
  ASSERT_TRUE((*link)->SendAndWait(0, Pattern(1000, 1), Deadline::AfterSeconds(10)).ok());
  Stopwatch clock;
  server.reset();
  const Status s = (*link)->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(10));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("closed the link"), std::string::npos) << s;
  EXPECT_LT(clock.ElapsedSeconds(), 3.0);
  EXPECT_EQ((*link)->Estimates().stream_failures, 0u) << "the streams closed, none failed";
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
    auto client = Endpoint::Create(options, nullptr);
    ASSERT_TRUE(client.ok());
    auto link = (*client)->Connect("us", "127.0.0.1", server.port, nullptr);
    ASSERT_TRUE(link.ok());
    ASSERT_TRUE((*link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());
    ASSERT_TRUE((*link)->SendAndWait(0, Pattern(1000, 1), Deadline::AfterSeconds(10)).ok());
    // Close() leaves the close records being written; the destructor must still see them out
    // and close the streams, not leave them to a StreamConn <-> LinkCore cycle.
    (*link)->Close();
    client->reset();
    link->reset();  // the last handle: the I/O context goes with it
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

TEST_F(NetLink, CloseFailsLaterSendsAndTellsThePeer) {
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"eu"})).ok());
  auto client = Endpoint::Create(Options("eu", eu_, {"us"}), nullptr);
  ASSERT_TRUE(client.ok());
  auto link = (*client)->Connect("us", "127.0.0.1", server.port, nullptr);
  ASSERT_TRUE(link.ok());
  ASSERT_TRUE((*link)->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(10)).ok());
  (*link)->Close();
  EXPECT_EQ((*link)->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(5)).code(),
            StatusCode::kCancelled);
  std::shared_ptr<Link> accepted = server.link(0);
  ASSERT_NE(accepted, nullptr);
  const Status s = accepted->SendAndWait(0, Pattern(10, 1), Deadline::AfterSeconds(5));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_EQ(server.endpoint->Counters().links_accepted, 1u);  // no redial after a close
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
  auto client = Endpoint::Create(options, nullptr);
  ASSERT_TRUE(client.ok()) << client.status();
  auto link = (*client)->Connect("us", "127.0.0.1", *port, nullptr);
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE((*link)->WaitForStreams(1, Deadline::AfterSeconds(10)).ok());
  SendTracker sends;
  (*link)->Send(16, Pattern(48u << 20, 1), Deadline::AfterSeconds(60), sends.Done());
  (*link)->Send(17, Pattern(1000, 2), Deadline::AfterSeconds(60), sends.Done());
  ASSERT_TRUE(sends.WaitFor(2, 60));
  for (const Status& s : sends.results()) EXPECT_TRUE(s.ok()) << s;
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return order.size() == 2; }));
  EXPECT_EQ(order, (std::vector<uint32_t>{17, 16}));
  lock.unlock();
  client->reset();
  server->reset();
}

}  // namespace
}  // namespace strait::net
