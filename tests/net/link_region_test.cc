// Plain TCP among one region's own gateways (Endpoint::ListenInRegion / ConnectInRegion) on an
// endpoint whose WAN side stays TLS: in-region links carry messages without TLS, WAN peers are
// unharmed, and the in-region listener refuses every stream but a plain one from a listed address
// whose hello names the endpoint's own region. Real links over loopback; every wait is bounded.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "net/link.h"
#include "net/wire.h"
#include "tests/net/link_fixtures.h"

namespace strait::net {
namespace {

// A "us" gateway with a TLS WAN listener and a plain in-region one admitting `region_hosts`.
struct RegionServer : Server {
  uint16_t region_port = 0;
  Status StartInRegion(EndpointOptions options, const std::vector<std::string>& region_hosts) {
    STRAIT_RETURN_IF_ERROR(Start(std::move(options)));
    auto p = endpoint->ListenInRegion("127.0.0.1", 0, region_hosts);
    if (!p.ok()) return p.status();
    region_port = *p;
    return Status::Ok();
  }
};

TEST_F(NetLink, RegionGatewaysLinkOverPlainTcpBesideTlsPeers) {
  RegionServer server;
  ASSERT_TRUE(server.StartInRegion(Options("us", us_, {"us", "eu"}), {"127.0.0.1"}).ok());

  // The region's other gateway dials the in-region port; its own WAN side is TLS as well.
  auto neighbour = Endpoint::Create(Options("us", us_, {"us", "eu"}), nullptr);
  ASSERT_TRUE(neighbour.ok()) << neighbour.status();
  auto link = (*neighbour)->ConnectInRegion("127.0.0.1", server.region_port, nullptr);
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE((*link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok());
  const std::vector<uint8_t> big = Pattern(3 << 20, 11);
  EXPECT_TRUE((*link)->SendAndWait(7, big, Deadline::AfterSeconds(10)).ok());
  ASSERT_TRUE(server.received.WaitFor(1, 5));
  EXPECT_EQ(server.received.messages()[7].at(0), big);
  ASSERT_NE(server.link(0), nullptr);
  EXPECT_EQ(server.link(0)->peer_region(), "us");

  // It is plain TCP: garbage there fails as a bad hello, not as a TLS handshake.
  EXPECT_TRUE(RawPeerIsClosed(server.region_port, nullptr, Pattern(64, 5), 5));
  EXPECT_TRUE(Eventually([&] { return server.endpoint->Counters().bad_magic >= 1; }, 5));
  EXPECT_EQ(server.endpoint->Counters().tls_handshake_failures, 0u);

  // A WAN peer on the TLS port is unaffected.
  auto wan = Dial(Options("eu", eu_, {"us"}), server.port);
  ASSERT_TRUE(wan.ok()) << wan.status();
  EXPECT_TRUE(wan->link->SendAndWait(2, Pattern(100000, 3), Deadline::AfterSeconds(10)).ok());
  ASSERT_TRUE(server.received.WaitFor(2, 5));
  EXPECT_EQ(server.endpoint->Counters().links_accepted, 2u);
}

TEST_F(NetLink, InRegionListenerAdmitsOnlyItsRegionFromListedAddresses) {
  // Another region's gateway, plain on its side, says "eu" in its hello: refused, although "eu"
  // is a configured peer (it belongs on the TLS port).
  RegionServer server;
  ASSERT_TRUE(server.StartInRegion(Options("us", us_, {"us", "eu"}), {"127.0.0.1"}).ok());
  EndpointOptions eu = Options("eu", eu_, {"us"});
  eu.link.unreachable_after_ns = 400'000'000;
  auto stranger = Endpoint::Create(eu, nullptr);
  ASSERT_TRUE(stranger.ok());
  auto sneaky = (*stranger)->ConnectInRegion("127.0.0.1", server.region_port, nullptr);
  ASSERT_TRUE(sneaky.ok());
  EXPECT_FALSE((*sneaky)->WaitForStreams(1, Deadline::AfterSeconds(2)).ok());
  EXPECT_GE(server.endpoint->Counters().identity_mismatch, 1u);

  // A TLS dialer on the plain port: no Strait hello, refused.
  const uint64_t bad_magic = server.endpoint->Counters().bad_magic;
  EndpointOptions us = Options("us", us_, {"us"});
  us.link.unreachable_after_ns = 400'000'000;
  auto tls_dialer = Endpoint::Create(us, nullptr);
  ASSERT_TRUE(tls_dialer.ok());
  auto tls_link = (*tls_dialer)->Connect("us", "127.0.0.1", server.region_port, nullptr);
  ASSERT_TRUE(tls_link.ok());
  EXPECT_FALSE((*tls_link)->WaitForStreams(1, Deadline::AfterSeconds(2)).ok());
  EXPECT_GT(server.endpoint->Counters().bad_magic, bad_magic);
  EXPECT_EQ(server.endpoint->Counters().links_accepted, 0u);

  // The right region from an address not listed: refused before its hello is read.
  RegionServer elsewhere;
  ASSERT_TRUE(elsewhere.StartInRegion(Options("us", us_, {"us"}), {"127.0.0.2"}).ok());
  auto neighbour = Endpoint::Create(us, nullptr);
  ASSERT_TRUE(neighbour.ok());
  auto unlisted = (*neighbour)->ConnectInRegion("127.0.0.1", elsewhere.region_port, nullptr);
  ASSERT_TRUE(unlisted.ok());
  EXPECT_FALSE((*unlisted)->WaitForStreams(1, Deadline::AfterSeconds(2)).ok());
  EXPECT_GE(elsewhere.endpoint->Counters().unknown_region, 1u);
  EXPECT_EQ(elsewhere.endpoint->Counters().links_accepted, 0u);
}

TEST_F(NetLink, InRegionListenerOnIpv6AnyAdmitsListedIpv4Gateways) {
  // A dual-stack listener sees an IPv4 peer as ::ffff:127.0.0.1; the listed 127.0.0.1 is it.
  Server server;
  ASSERT_TRUE(server.Start(Options("us", us_, {"us"})).ok());
  auto region_port = server.endpoint->ListenInRegion("::", 0, {"127.0.0.1"});
  if (!region_port.ok()) GTEST_SKIP() << "no IPv6 here: " << region_port.status();
  auto neighbour = Endpoint::Create(Options("us", us_, {"us"}), nullptr);
  ASSERT_TRUE(neighbour.ok());
  auto link = (*neighbour)->ConnectInRegion("127.0.0.1", *region_port, nullptr);
  ASSERT_TRUE(link.ok());
  ASSERT_TRUE((*link)->WaitForStreams(4, Deadline::AfterSeconds(10)).ok())
      << "unknown_region " << server.endpoint->Counters().unknown_region;
  EXPECT_TRUE((*link)->SendAndWait(1, Pattern(4096, 2), Deadline::AfterSeconds(10)).ok());
  EXPECT_EQ(server.endpoint->Counters().unknown_region, 0u);
}

TEST_F(NetLink, ListenInRegionRefusesBadArguments) {
  auto e = Endpoint::Create(Options("us", us_, {"us"}), nullptr);
  ASSERT_TRUE(e.ok());
  auto none = (*e)->ListenInRegion("127.0.0.1", 0, {});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument) << none.status();
  auto named = (*e)->ListenInRegion("127.0.0.1", 0, {"gateway-1.lan"});
  EXPECT_EQ(named.status().code(), StatusCode::kInvalidArgument) << named.status();
  EXPECT_NE(named.status().message().find("gateway-1.lan"), std::string::npos);
  auto bad_address = (*e)->ListenInRegion("localhost", 0, {"127.0.0.1"});
  EXPECT_EQ(bad_address.status().code(), StatusCode::kInvalidArgument);
  // Its own region must be a configured peer, or every in-region stream would be refused.
  auto lonely = Endpoint::Create(Options("us", us_, {"eu"}), nullptr);
  ASSERT_TRUE(lonely.ok());
  auto not_peer = (*lonely)->ListenInRegion("127.0.0.1", 0, {"127.0.0.1"});
  EXPECT_EQ(not_peer.status().code(), StatusCode::kFailedPrecondition) << not_peer.status();
  ASSERT_TRUE((*e)->ListenInRegion("127.0.0.1", 0, {"127.0.0.1"}).ok());
  auto twice = (*e)->ListenInRegion("127.0.0.1", 0, {"127.0.0.1"});
  EXPECT_EQ(twice.status().code(), StatusCode::kFailedPrecondition) << twice.status();
}

}  // namespace
}  // namespace strait::net
