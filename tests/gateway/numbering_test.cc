// How an all-reduce is numbered (gateway/numbering.h): the region op ids are distinct per tensor,
// scope and region size, keep the job's lane, and are pinned to fixed values -- they travel
// between gateways, so a change here is a wire change that must show up as a failing test.
#include "gateway/numbering.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "collective/channels.h"
#include "gateway/gateway.h"

namespace strait::gateway {
namespace {

using localproto::Message;
using localproto::MessageType;

constexpr uint64_t kLanes = collective::kCollectiveChannelCount;

TEST(Numbering, PinnedValues) {
  // Computed once from the derivations as they shipped; gateways of different builds pair only
  // while these hold.
  EXPECT_EQ(OperationId("job", "w", 0), 205681046005u);
  EXPECT_EQ(IdentityWord(3, 7), 16753576447339095367u);
  EXPECT_EQ(RegionSideOpId("job", "w", 0, IdentityWord(3, 7)), 241506092949u);
  EXPECT_EQ(RegionSideOpId("job", "w", 2, IdentityWord(3, 7)), 79762774933u);
  EXPECT_EQ(RegionCrossOpId("job", "w", 3, 12345), 193011595925u);
}

TEST(Numbering, RegionSideOpIdIsDistinctPerTensorAndScope) {
  const uint64_t word = IdentityWord(1, 5);
  std::set<uint64_t> ids;
  for (const char* key : {"w", "b", "layer.0", "layer.1"}) {
    for (uint64_t scope : {0u, 1u, 2u}) {
      const uint64_t id = RegionSideOpId("job", key, scope, word);
      EXPECT_EQ(id, RegionSideOpId("job", key, scope, word)) << "stable";
      EXPECT_EQ(id % kLanes, JobLane("job")) << "keeps the job's lane";
      EXPECT_LT(id, uint64_t{1} << 38);
      ids.insert(id);
    }
  }
  EXPECT_EQ(ids.size(), 12u);
  // Another step, or another job, is another operation.
  EXPECT_NE(RegionSideOpId("job", "w", 0, IdentityWord(1, 6)), RegionSideOpId("job", "w", 0, word));
  EXPECT_NE(RegionSideOpId("job", "w", 0, word), RegionSideOpId("job2", "w", 0, word));
  // Never the op id of a plain all-reduce with the same word.
  Message plain;
  plain.type = MessageType::kAllReduce;
  plain.tensor_key = "w";
  EXPECT_NE(RegionSideOpId("job", "w", 0, word),
            OperationId("job", IdentityText(plain, nullptr), word));
}

TEST(Numbering, RegionCrossOpIdDependsOnTheRegionSize) {
  const uint64_t base = OperationId("job", "identity", IdentityWord(0, 1));
  EXPECT_NE(RegionCrossOpId("job", "w", 2, base), RegionCrossOpId("job", "w", 3, base));
  EXPECT_NE(RegionCrossOpId("job", "w", 2, base), RegionCrossOpId("job", "b", 2, base));
  EXPECT_NE(RegionCrossOpId("job", "w", 2, base), base);
  EXPECT_EQ(RegionCrossOpId("job", "w", 2, base) % kLanes, JobLane("job"));
}

TEST(Numbering, GenerationKeyAndIdentityTextNameTheScope) {
  EXPECT_EQ(GenerationKey("job", 0), "job");
  EXPECT_NE(GenerationKey("job", 1), GenerationKey("job", 2));
  EXPECT_NE(GenerationKey("job", 1), "job");
  Message m;
  m.type = MessageType::kAllReduce;
  m.tensor_key = "w";
  const std::string unscoped = IdentityText(m, nullptr);
  EXPECT_EQ(unscoped.find("scope="), std::string::npos);
  m.scope = 4;
  EXPECT_NE(IdentityText(m, nullptr).find(" scope=4"), std::string::npos);
  FrameInfo frame;
  frame.codec = CodecId::kInt8;
  frame.block_size = 256;
  EXPECT_NE(IdentityText(m, &frame).find(" frame=int8/256"), std::string::npos);
}

// The gateway's own part of an identity (its chunk size, then measured weights) comes after what
// the ranks' request determines, and RanksIdentityPart takes it off again -- also from an older
// straitd's identity, which has weights but no chunk size.
TEST(Numbering, TheGatewaysPartOfAnIdentityComesLastAndIsSeparable) {
  Message m;
  m.type = MessageType::kAllReduce;
  m.tensor_key = "w";
  m.count = 10;
  const std::string ranks = IdentityText(m, nullptr);
  const std::string mine = ranks + GatewayIdentityText(131072);
  EXPECT_EQ(mine, ranks + " chunk=131072");
  EXPECT_EQ(RanksIdentityPart(mine), ranks);
  EXPECT_EQ(RanksIdentityPart(mine + " weights=2/1/1"), ranks);
  EXPECT_EQ(RanksIdentityPart(ranks + " weights=2/1/1"), ranks);
  EXPECT_EQ(RanksIdentityPart(ranks), ranks);
}

}  // namespace
}  // namespace strait::gateway
