// The all-reduce over real strait::net links: three gateways ("regions") on 127.0.0.1 with TLS
// and throwaway certificates, a full mesh of links, a lossless and a lossy all-reduce that agree
// bit for bit on every rank, a malformed message that fails the peer at once, an abort that ends
// the other gateways' waits with its reason and note, hellos that make incarnations known, and a
// peer's new incarnation that drops its old messages.
#include "collective/net_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <thread>

#include "collective/allreduce.h"
#include "net/link.h"
#include "tests/net/test_certs.h"

namespace strait::collective {
namespace {

using net::testing::CertFiles;
using net::testing::TestPki;

constexpr int kWorld = 3;
const char* const kRegions[kWorld] = {"us", "eu", "ap"};

int RankOf(const std::string& region) {
  for (int r = 0; r < kWorld; ++r) {
    if (region == kRegions[r]) return r;
  }
  return -1;
}

// One gateway: an endpoint, its transport, and its links to every other rank.
struct Gateway {
  std::unique_ptr<NetTransport> transport;
  std::unique_ptr<net::Endpoint> endpoint;
  uint16_t port = 0;
  std::mutex mu;
  std::vector<std::shared_ptr<net::Link>> links = std::vector<std::shared_ptr<net::Link>>(kWorld);

  int LinkCount() {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const auto& l : links) n += l != nullptr;
    return n;
  }
  void Keep(int peer, std::shared_ptr<net::Link> link) {
    transport->SetLink(peer, link);
    std::lock_guard<std::mutex> lock(mu);
    links[static_cast<size_t>(peer)] = std::move(link);
  }
};

class CollectiveOverNet : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = TestPki::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_.emplace(std::move(pki).value());
    ASSERT_TRUE(pki_->MakeCa("cluster-ca").ok());
    std::vector<std::string> names(kRegions, kRegions + kWorld);
    for (int r = 0; r < kWorld; ++r) {
      auto files = pki_->MakeGateway("cluster-ca", kRegions[r], kRegions[r]);
      ASSERT_TRUE(files.ok()) << files.status();
      net::EndpointOptions o;
      o.region = kRegions[r];
      o.ca_file = files->ca;
      o.cert_file = files->cert;
      o.key_file = files->key;
      for (int p = 0; p < kWorld; ++p) {
        if (p != r) o.peer_regions.push_back(kRegions[p]);
      }
      o.link.streams = 2;
      o.link.adapt_streams = false;
      o.link.chunk_bytes = 64 * 1024;
      o.link.handshake_timeout_ns = 5'000'000'000;
      o.link.unreachable_after_ns = 5'000'000'000;
      Gateway& g = gateways_[r];
      g.transport = std::make_unique<NetTransport>(r, kWorld, names);
      auto endpoint = net::Endpoint::Create(o, [&g](std::shared_ptr<net::Link> link) {
        const int peer = RankOf(link->peer_region());
        g.Keep(peer, link);
        return net::MessageCallback(g.transport->ReceiverFor(peer));
      });
      ASSERT_TRUE(endpoint.ok()) << endpoint.status();
      g.endpoint = std::move(endpoint).value();
      auto port = g.endpoint->Listen("127.0.0.1", 0);
      ASSERT_TRUE(port.ok()) << port.status();
      g.port = *port;
    }
    // Each rank dials the ranks above it; the accepted side registers the link when it arrives.
    for (int r = 0; r < kWorld; ++r) {
      for (int p = r + 1; p < kWorld; ++p) {
        Gateway& g = gateways_[r];
        auto link = g.endpoint->Connect(kRegions[p], "127.0.0.1", gateways_[p].port,
                                        g.transport->ReceiverFor(p));
        ASSERT_TRUE(link.ok()) << link.status();
        ASSERT_TRUE((*link)->WaitForStreams(1, Deadline::AfterSeconds(20)).ok());
        g.Keep(p, *link);
      }
    }
    const Deadline until = Deadline::AfterSeconds(20);
    for (int r = 0; r < kWorld; ++r) {
      while (gateways_[r].LinkCount() < kWorld - 1 && !until.Expired()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ASSERT_EQ(gateways_[r].LinkCount(), kWorld - 1) << "rank " << r << " is missing links";
    }
  }

  void TearDown() override {
    for (auto& g : gateways_) g.endpoint.reset();
    pki_.reset();
  }

  std::vector<Status> RunAll(const AllReduceRequest& base, std::vector<std::vector<float>>* data) {
    std::vector<Status> statuses(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        AllReduceRequest req = base;
        req.data = (*data)[static_cast<size_t>(r)].data();
        statuses[static_cast<size_t>(r)] = AllReduce(*gateways_[r].transport, req);
      });
    }
    for (auto& t : threads) t.join();
    return statuses;
  }

  std::optional<TestPki> pki_;
  Gateway gateways_[kWorld];
};

std::vector<std::vector<float>> Inputs(size_t count) {
  std::vector<std::vector<float>> data(kWorld, std::vector<float>(count));
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < count; ++i) {
      // Small integers: the fp32 sums are exact, so the expected value is known.
      data[static_cast<size_t>(r)][i] =
          static_cast<float>(static_cast<int>((i * 7 + r * 13) % 41) - 20);
    }
  }
  return data;
}

TEST_F(CollectiveOverNet, ThreeGatewaysAllReduceOverTls) {
  constexpr size_t kCount = 100003;
  const auto inputs = Inputs(kCount);
  AllReduceRequest req;
  req.job = "job";
  req.tensor_key = "w";
  req.op_id = 1;
  req.count = kCount;
  req.codec.codec = CodecId::kZstd;
  req.chunk_elements = 16384;
  req.shard_weights = {3, 1, 2};
  req.deadline = Deadline::AfterSeconds(30);
  auto data = inputs;
  std::vector<Status> statuses = RunAll(req, &data);
  for (int r = 0; r < kWorld; ++r)
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  for (size_t i = 0; i < kCount; ++i) {
    const float want = inputs[0][i] + inputs[1][i] + inputs[2][i];
    ASSERT_EQ(data[0][i], want) << i;
  }
  EXPECT_EQ(data[1], data[0]);
  EXPECT_EQ(data[2], data[0]);

  // A lossy run with error feedback: bit-identical on every gateway.
  std::vector<ErrorFeedbackStore> stores(kWorld);
  req.op_id = 2;
  req.codec.codec = CodecId::kInt8;
  req.error_feedback = true;
  data = inputs;
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      AllReduceRequest q = req;
      q.data = data[static_cast<size_t>(r)].data();
      q.feedback = &stores[static_cast<size_t>(r)];
      statuses[static_cast<size_t>(r)] = AllReduce(*gateways_[r].transport, q);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(statuses[r].ok()) << statuses[r];
  EXPECT_TRUE(std::memcmp(data[1].data(), data[0].data(), kCount * 4) == 0);
  EXPECT_TRUE(std::memcmp(data[2].data(), data[0].data(), kCount * 4) == 0);
  for (size_t i = 0; i < kCount; ++i) {
    const float want = inputs[0][i] + inputs[1][i] + inputs[2][i];
    ASSERT_NEAR(data[0][i], want, 0.5) << i;  // int8 steps of at most 60/127 per quantization
  }
  for (const auto& g : gateways_) EXPECT_EQ(g.transport->BufferedMessages(), 0u);
}

TEST_F(CollectiveOverNet, MalformedMessageFailsThePeerAtOnce) {
  // Rank 1 sends rank 0 a message with a wrong version on the collective channel.
  std::shared_ptr<net::Link> link;
  {
    std::lock_guard<std::mutex> lock(gateways_[1].mu);
    link = gateways_[1].links[0];
  }
  std::vector<uint8_t> bad(kNetTransportTrailerSize, 0);  // a trailer alone, like a hello
  bad[0] = 99;
  bad[4] = 1;
  ASSERT_TRUE(link->SendAndWait(kDefaultCollectiveChannel, bad, Deadline::AfterSeconds(10)).ok());
  std::vector<uint8_t> out;
  Stopwatch watch;
  Status s = gateways_[0].transport->Recv(1, 5, Deadline::AfterSeconds(20), &out);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("rank 1 (eu)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("version 99"), std::string::npos) << s;
  EXPECT_LT(watch.ElapsedSeconds(), 10.0);
}

// A gateway of wire version 3 (header in front) sends its hello on every new link: 24 bytes that
// read as a trailer of version 3, so an upgraded peer refuses it by name instead of taking
// payload bytes for framing.
TEST_F(CollectiveOverNet, AVersion3HelloIsRefusedByName) {
  std::shared_ptr<net::Link> link;
  {
    std::lock_guard<std::mutex> lock(gateways_[1].mu);
    link = gateways_[1].links[0];
  }
  std::vector<uint8_t> hello(kNetTransportTrailerSize, 0);
  hello[0] = 3;
  hello[1] = static_cast<uint8_t>(NetMessageKind::kHello);
  hello[4] = 1;
  hello[16] = 0x77;
  ASSERT_TRUE(link->SendAndWait(kDefaultCollectiveChannel, hello, Deadline::AfterSeconds(10)).ok());
  std::vector<uint8_t> out;
  Status s = gateways_[0].transport->Recv(1, 5, Deadline::AfterSeconds(20), &out);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("version 3 (this build speaks 4"), std::string::npos) << s;
}

TEST(NetMessageSender, ReadsTheTrailersRank) {
  EXPECT_EQ(NetMessageSender({}), -1);
  EXPECT_EQ(NetMessageSender(std::vector<uint8_t>(kNetTransportTrailerSize - 1, 0)), -1);
  std::vector<uint8_t> m(5 + kNetTransportTrailerSize, 0xee);  // payload bytes must not matter
  uint8_t* t = m.data() + 5;
  for (int i = 0; i < 4; ++i) t[4 + i] = static_cast<uint8_t>(0x0102 >> (8 * i));
  EXPECT_EQ(NetMessageSender(m), 0x0102);
  t[7] = 0x80;  // above INT32_MAX
  EXPECT_EQ(NetMessageSender(m), -1);
}

// Waits until every gateway heard every peer's hello.
void WaitForIncarnations(Gateway* gateways) {
  const Deadline until = Deadline::AfterSeconds(20);
  for (int r = 0; r < kWorld; ++r) {
    for (int p = 0; p < kWorld; ++p) {
      while (gateways[r].transport->PeerIncarnation(p) == 0 && !until.Expired()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      EXPECT_EQ(gateways[r].transport->PeerIncarnation(p), gateways[p].transport->incarnation())
          << "rank " << r << " about rank " << p;
    }
  }
}

TEST_F(CollectiveOverNet, AbortEndsThePeersWaitsWithTheReasonAndCarriesTheNote) {
  WaitForIncarnations(gateways_);
  std::mutex mu;
  std::vector<std::string> notes;
  for (int r = 0; r < 2; ++r) {
    gateways_[r].transport->SetAbortListener(
        [&mu, &notes, r](int peer, uint64_t op, const std::string& note) {
          std::lock_guard<std::mutex> lock(mu);
          notes.push_back(std::to_string(r) + "<-" + std::to_string(peer) + " op " +
                          std::to_string(op) + " " + note);
        });
  }
  constexpr uint64_t kOp = 1234;
  // Rank 1 already sent rank 0 a frame of the op: the abort frees it.
  gateways_[1].transport->Send(0, MakeTag(kOp, TagPhase::kMeshScatter, 0), {1, 2, 3},
                               Deadline::AfterSeconds(10), [](Status) {});
  Status waited;
  Stopwatch watch;
  std::thread waiter([&] {
    std::vector<uint8_t> out;
    waited = gateways_[0].transport->Recv(2, MakeTag(kOp, TagPhase::kMeshGather, 0),
                                          Deadline::AfterSeconds(30), &out);
  });
  gateways_[2].transport->Abort(kOp, DeadlineExceededError("the test gave up"), "note-x");
  waiter.join();
  EXPECT_EQ(waited.code(), StatusCode::kAborted) << waited;
  EXPECT_NE(waited.message().find("rank 2 (ap) aborted the operation"), std::string::npos)
      << waited;
  EXPECT_NE(waited.message().find("the test gave up"), std::string::npos) << waited;
  EXPECT_LT(watch.ElapsedSeconds(), 10.0);
  const Deadline until = Deadline::AfterSeconds(10);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (notes.size() == 2 || until.Expired()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard<std::mutex> lock(mu);
  std::sort(notes.begin(), notes.end());
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[0], "0<-2 op 1234 note-x");
  EXPECT_EQ(notes[1], "1<-2 op 1234 note-x");
  EXPECT_EQ(gateways_[0].transport->BufferedMessages(), 0u);
}

TEST_F(CollectiveOverNet, ANewIncarnationDropsThePeersOldMessages) {
  WaitForIncarnations(gateways_);
  const uint64_t old_tag = MakeTag(7, TagPhase::kMeshScatter, 0);
  gateways_[1].transport->Send(0, old_tag, {1, 2, 3}, Deadline::AfterSeconds(10), [](Status) {});
  const Deadline until = Deadline::AfterSeconds(10);
  while (gateways_[0].transport->BufferedMessages() < 1 && !until.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(gateways_[0].transport->BufferedMessages(), 1u);
  // Rank 1 "restarts": a message with another incarnation arrives on its link.
  std::shared_ptr<net::Link> link;
  {
    std::lock_guard<std::mutex> lock(gateways_[1].mu);
    link = gateways_[1].links[0];
  }
  const uint64_t new_tag = MakeTag(8, TagPhase::kMeshScatter, 0);
  std::vector<uint8_t> m(1 + kNetTransportTrailerSize, 0);
  m[0] = 9;  // the payload, then the trailer
  uint8_t* t = m.data() + 1;
  t[0] = kNetTransportVersion;
  t[1] = static_cast<uint8_t>(NetMessageKind::kData);
  t[4] = 1;  // sender rank
  for (int i = 0; i < 8; ++i) t[8 + i] = static_cast<uint8_t>(new_tag >> (8 * i));
  t[16] = 0x5a;  // incarnation 0x5a
  ASSERT_TRUE(link->SendAndWait(kDefaultCollectiveChannel, m, Deadline::AfterSeconds(10)).ok());
  std::vector<uint8_t> out;
  ASSERT_TRUE(gateways_[0].transport->Recv(1, new_tag, Deadline::AfterSeconds(10), &out).ok());
  EXPECT_EQ(out, std::vector<uint8_t>{9});
  EXPECT_EQ(gateways_[0].transport->PeerRestarts(), 1u);
  EXPECT_EQ(gateways_[0].transport->PeerIncarnation(1), 0x5au);
  EXPECT_EQ(gateways_[0].transport->BufferedMessages(), 0u) << "the old incarnation's message";
  // What the old incarnation still sends is dropped on arrival.
  Status sent = InternalError("not done");
  std::atomic<bool> done{false};
  gateways_[1].transport->Send(0, old_tag, {4}, Deadline::AfterSeconds(10), [&](Status st) {
    sent = st;
    done = true;
  });
  while (!done && !until.Expired()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(sent.ok()) << sent;
  EXPECT_EQ(gateways_[0].transport->Recv(1, old_tag, Deadline::After(200'000'000), &out).code(),
            StatusCode::kDeadlineExceeded);
}

// A message with kSendHeadroom of spare capacity gets its trailer in its own buffer, one without
// is copied into a larger one: the receiver gets the same bytes either way, at every size (empty,
// one byte, several link chunks), and the sender's completion reports success.
TEST_F(CollectiveOverNet, MessagesWithAndWithoutHeadroomArriveIntact) {
  WaitForIncarnations(gateways_);
  uint64_t chunk = 0;
  for (const size_t size : {size_t{0}, size_t{1}, size_t{300'001}}) {
    for (const bool headroom : {true, false}) {
      std::vector<uint8_t> payload;
      if (headroom) payload.reserve(size + kSendHeadroom);
      payload.resize(size);  // without the reserve: capacity == size
      for (size_t i = 0; i < size; ++i) payload[i] = static_cast<uint8_t>(i * 31 + size);
      ASSERT_EQ(payload.capacity() - payload.size() >= kNetTransportTrailerSize, headroom)
          << "the test's own premise: which path this message takes";
      const std::vector<uint8_t> expected = payload;
      const uint64_t tag = MakeTag(9, TagPhase::kMeshScatter, chunk++);
      std::atomic<bool> done{false};
      Status sent = InternalError("not done");
      gateways_[2].transport->Send(0, tag, std::move(payload), Deadline::AfterSeconds(10),
                                   [&](Status st) {
                                     sent = st;
                                     done = true;
                                   });
      std::vector<uint8_t> out;
      ASSERT_TRUE(gateways_[0].transport->Recv(2, tag, Deadline::AfterSeconds(10), &out).ok());
      EXPECT_EQ(out, expected) << size << " bytes, headroom " << headroom;
      const Deadline until = Deadline::AfterSeconds(10);
      while (!done && !until.Expired()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      EXPECT_TRUE(sent.ok()) << sent;
    }
  }
}

}  // namespace
}  // namespace strait::collective
