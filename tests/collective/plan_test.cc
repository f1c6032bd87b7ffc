// Tests of MakePlan: shards proportional to weights, non-empty and block-aligned where possible,
// chunks covering every shard, the same plan from the same options, and the algorithm choice.
#include "collective/plan.h"

#include <gtest/gtest.h>

#include <numeric>

namespace strait::collective {
namespace {

// Checks the invariants every plan must hold and returns the shard sizes.
std::vector<size_t> CheckedShardSizes(const Plan& plan) {
  std::vector<size_t> sizes;
  size_t at = 0;
  EXPECT_EQ(plan.shards.size(), static_cast<size_t>(plan.world));
  EXPECT_EQ(plan.first_chunk.size(), static_cast<size_t>(plan.world) + 1);
  for (int i = 0; i < plan.world; ++i) {
    const Shard& s = plan.shards[static_cast<size_t>(i)];
    EXPECT_EQ(s.begin, at) << "shard " << i;
    size_t covered = s.begin;
    for (size_t k = 0; k < plan.ChunkCount(i); ++k) {
      const Chunk& c = plan.ChunkOf(i, k);
      EXPECT_EQ(c.owner, i);
      EXPECT_EQ(c.begin, covered);
      EXPECT_GT(c.count, 0u);
      EXPECT_LE(c.count, plan.chunk_elements);
      EXPECT_EQ(plan.chunks[c.id].begin, c.begin);
      covered += c.count;
    }
    EXPECT_EQ(covered, s.begin + s.count) << "shard " << i;
    at += s.count;
    sizes.push_back(s.count);
  }
  EXPECT_EQ(at, plan.count);
  return sizes;
}

TEST(Plan, EqualWeightsGiveEqualShards) {
  PlanOptions o;
  o.count = 4096;
  o.world = 4;
  o.align = 256;
  o.chunk_elements = 300;  // rounds up to 512
  auto plan = MakePlan(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk_elements, 512u);
  EXPECT_EQ(CheckedShardSizes(*plan), (std::vector<size_t>{1024, 1024, 1024, 1024}));
  EXPECT_EQ(plan->chunks.size(), 8u);
  EXPECT_EQ(plan->algorithm, Algorithm::kMesh);
}

TEST(Plan, UnequalWeightsGiveProportionalAlignedShards) {
  PlanOptions o;
  o.count = 100003;
  o.world = 4;
  o.weights = {100, 200, 300, 400};
  o.align = 256;
  o.chunk_elements = 4096;
  auto plan = MakePlan(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<size_t> sizes = CheckedShardSizes(*plan);
  for (int i = 0; i < 4; ++i) {
    const double want = 100003.0 * o.weights[static_cast<size_t>(i)] / 1000.0;
    EXPECT_NEAR(static_cast<double>(sizes[static_cast<size_t>(i)]), want, 2 * 256.0) << i;
    // Every boundary but the tensor's end falls on a block.
    EXPECT_EQ(plan->shards[static_cast<size_t>(i)].begin % 256, 0u);
  }
  EXPECT_LT(sizes[0], sizes[1]);
  EXPECT_LT(sizes[1], sizes[2]);
  EXPECT_LT(sizes[2], sizes[3]);
}

TEST(Plan, HugeWeightsDoNotOverflow) {
  PlanOptions o;
  o.count = size_t{1} << 40;
  o.world = 3;
  o.weights = {UINT64_MAX, UINT64_MAX / 2, 1};
  o.chunk_elements = size_t{1} << 30;
  auto plan = MakePlan(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<size_t> sizes = CheckedShardSizes(*plan);
  EXPECT_GE(sizes[2], 1u);
  EXPECT_NEAR(static_cast<double>(sizes[0]) / static_cast<double>(sizes[1]), 2.0, 1e-6);
}

TEST(Plan, EveryShardIsNonEmptyWhenCountAtLeastWorld) {
  for (int world = 1; world <= 5; ++world) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{5}, size_t{7}, size_t{255},
                         size_t{256}, size_t{1000}, size_t{1025}}) {
      PlanOptions o;
      o.count = count;
      o.world = world;
      o.weights.assign(static_cast<size_t>(world), 1);
      o.weights[0] = 1000;  // a dominant owner must not starve the others
      o.align = 256;
      o.chunk_elements = 64;
      auto plan = MakePlan(o);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const std::vector<size_t> sizes = CheckedShardSizes(*plan);
      const size_t non_empty = static_cast<size_t>(
          std::count_if(sizes.begin(), sizes.end(), [](size_t s) { return s > 0; }));
      EXPECT_EQ(non_empty, std::min(count, static_cast<size_t>(world)))
          << "world " << world << " count " << count;
    }
  }
}

TEST(Plan, SameOptionsGiveTheSamePlan) {
  PlanOptions o;
  o.count = 77777;
  o.world = 3;
  o.weights = {7, 3, 11};
  o.align = 64;
  o.chunk_elements = 1000;
  auto a = MakePlan(o);
  auto b = MakePlan(o);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->chunks.size(), b->chunks.size());
  for (size_t i = 0; i < a->chunks.size(); ++i) {
    EXPECT_EQ(a->chunks[i].begin, b->chunks[i].begin);
    EXPECT_EQ(a->chunks[i].count, b->chunks[i].count);
  }
}

TEST(Plan, ChoosesRingWhenTheMeshIsIncompleteAndFailsWithoutARing) {
  PlanOptions o;
  o.count = 1000;
  o.world = 3;
  o.links.assign(9, 1);
  EXPECT_EQ(MakePlan(o)->algorithm, Algorithm::kMesh);
  o.links[0 * 3 + 2] = 0;  // 0 -> 2 missing; the ring 0->1->2->0 is intact
  EXPECT_EQ(MakePlan(o)->algorithm, Algorithm::kRing);
  o.algorithm = Algorithm::kMesh;
  auto forced = MakePlan(o);
  EXPECT_EQ(forced.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(forced.status().message().find("rank 0 to rank 2"), std::string::npos)
      << forced.status();
  o.algorithm = Algorithm::kAuto;
  o.links[1 * 3 + 2] = 0;  // 1 -> 2 missing too: no ring either
  EXPECT_EQ(MakePlan(o).status().code(), StatusCode::kFailedPrecondition);
  o.links.assign(9, 0);
  o.algorithm = Algorithm::kRing;
  o.links[0 * 3 + 1] = o.links[1 * 3 + 2] = o.links[2 * 3 + 0] = 1;
  EXPECT_EQ(MakePlan(o)->algorithm, Algorithm::kRing);
}

TEST(Plan, RejectsBadOptions) {
  PlanOptions o;
  o.count = 10;
  o.world = 0;
  EXPECT_EQ(MakePlan(o).status().code(), StatusCode::kInvalidArgument);
  o.world = 2;
  o.weights = {1, 2, 3};
  EXPECT_EQ(MakePlan(o).status().code(), StatusCode::kInvalidArgument);
  o.weights = {1, 0};
  EXPECT_EQ(MakePlan(o).status().code(), StatusCode::kInvalidArgument);
  o.weights = {};
  o.chunk_elements = 0;
  EXPECT_EQ(MakePlan(o).status().code(), StatusCode::kInvalidArgument);
  o.chunk_elements = 1;
  o.links = {1, 1, 1};
  EXPECT_EQ(MakePlan(o).status().code(), StatusCode::kInvalidArgument);
  o.links = {};
  o.count = size_t{1} << 30;  // 2^30 one-element chunks exceed the tag space
  auto too_many = MakePlan(o);
  EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("chunk_elements"), std::string::npos);
}

}  // namespace
}  // namespace strait::collective
