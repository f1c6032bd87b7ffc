// Tests of the link channel map and its router (collective/channels.h).
#include "collective/channels.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace strait::collective {
namespace {

TEST(ChannelMap, RangesAreWhereTheWireSaysAndApart) {
  // Wire values between gateways of different versions: never moved.
  EXPECT_EQ(kPolicyChannel, 8u);
  EXPECT_EQ(kGenerationChannel, 9u);
  EXPECT_EQ(kRatesChannel, 10u);
  EXPECT_EQ(kDefaultCollectiveChannel, 16u);
  EXPECT_EQ(kCollectiveChannelCount, 16u);
  EXPECT_EQ(kRegionCollectiveChannel, 32u);
  EXPECT_EQ(kTunnelChannels.first, 1024u);
  EXPECT_EQ(kTunnelChannels.count, 256u);
  // The compile-time check, and that it can fail.
  EXPECT_TRUE(NoTwoOverlap(kAllChannelRanges, std::size(kAllChannelRanges)));
  const ChannelRange clash[] = {kCollectiveChannels, ChannelRange{31, 2}};
  EXPECT_FALSE(NoTwoOverlap(clash, 2));
  const ChannelRange empty[] = {ChannelRange{5, 0}};
  EXPECT_FALSE(NoTwoOverlap(empty, 1));
  EXPECT_TRUE(kTunnelChannels.Contains(1279));
  EXPECT_FALSE(kTunnelChannels.Contains(1280));
  EXPECT_FALSE(kTunnelChannels.Contains(1023));
}

TEST(ChannelRouter, DispatchesEachChannelToItsRangesHandler) {
  ChannelRouter router;
  std::vector<std::pair<char, uint32_t>> got;
  auto record = [&got](char who) {
    return [&got, who](int peer, uint32_t channel, std::vector<uint8_t> message) {
      EXPECT_EQ(peer, 3);
      EXPECT_EQ(message.size(), 1u);
      got.emplace_back(who, channel);
    };
  };
  router.Route(kTunnelChannels, record('t'));
  router.Route(kPolicyChannels, record('p'));
  router.Route(kRatesChannels, record('r'));
  router.Route(kGenerationChannels, record('g'));
  for (uint32_t ch : {8u, 9u, 10u, 1024u, 1279u}) {
    EXPECT_TRUE(router.Dispatch(3, ch, {1})) << ch;
  }
  for (uint32_t ch : {0u, 7u, 11u, 16u, 1023u, 1280u, ~0u}) {
    EXPECT_FALSE(router.Dispatch(3, ch, {1})) << ch;
  }
  const std::vector<std::pair<char, uint32_t>> want = {
      {'p', 8}, {'g', 9}, {'r', 10}, {'t', 1024}, {'t', 1279}};
  EXPECT_EQ(got, want);
}

TEST(ChannelRouter, RefusesOverlappingRoutes) {
  ChannelRouter router;
  router.Route(kCollectiveChannels, [](int, uint32_t, std::vector<uint8_t>) {});
  EXPECT_THROW(router.Route(ChannelRange{20, 1}, [](int, uint32_t, std::vector<uint8_t>) {}),
               std::logic_error);
  router.Route(kRegionCollectiveChannels, [](int, uint32_t, std::vector<uint8_t>) {});
}

}  // namespace
}  // namespace strait::collective
