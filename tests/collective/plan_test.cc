// Tests of MakePlan: shards proportional to weights, non-empty and block-aligned where possible,
// chunks covering every shard, the same plan from the same options, and the algorithm choice.
#include "collective/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// ---- BalancedShardWeights --------------------------------------------------------------------

// A symmetric rate matrix from the pairs' rates, in pair order (0,1), (0,2), ..., (1,2), ...
std::vector<uint64_t> Symmetric(int n, const std::vector<uint64_t>& pair_rates) {
  std::vector<uint64_t> r(static_cast<size_t>(n * n), 0);
  size_t k = 0;
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j, ++k) {
      r[static_cast<size_t>(i * n + j)] = r[static_cast<size_t>(j * n + i)] = pair_rates.at(k);
    }
  }
  EXPECT_EQ(k, pair_rates.size());
  return r;
}

TEST(BalancedShardWeights, EqualRatesGiveEqualWeights) {
  for (int n : {1, 2, 3, 4, 5}) {
    const size_t pairs = static_cast<size_t>(n * (n - 1) / 2);
    auto w = BalancedShardWeights(Symmetric(n, std::vector<uint64_t>(pairs, 12'500'000)), n);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(*w, std::vector<uint64_t>(static_cast<size_t>(n), 1)) << n << " regions";
  }
}

TEST(BalancedShardWeights, MeasurementNoiseKeepsEqualWeights) {
  // Within a few percent of each other, as measured goodputs of equal links are.
  auto w3 = BalancedShardWeights(Symmetric(3, {12'400'000, 11'900'000, 12'650'000}), 3);
  ASSERT_TRUE(w3.ok());
  EXPECT_EQ(*w3, (std::vector<uint64_t>{1, 1, 1}));
  auto w4 = BalancedShardWeights(
      Symmetric(4, {1000, 1040, 980, 1010, 960, 1030}), 4);
  ASSERT_TRUE(w4.ok());
  EXPECT_EQ(*w4, (std::vector<uint64_t>{1, 1, 1, 1}));
}

TEST(BalancedShardWeights, HeterogeneousThreeRegions) {
  // Pairs 0-1 200, 0-2 100, 1-2 50 Mbit/s: the optimum is x = (100, 50, 0), shares (2/3, 1/3,
  // ~0); weights are 2x, at least 1.
  auto w = BalancedShardWeights(Symmetric(3, {200, 100, 50}), 3);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (std::vector<uint64_t>{200, 100, 1}));
  // The same in bytes/s, as gateways measure them: the same shares.
  auto b = BalancedShardWeights(Symmetric(3, {25'000'000, 12'500'000, 6'250'000}), 3);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<uint64_t>{25'000'000, 12'500'000, 1}));
  // Used as plan weights: the busiest pair (0-1) carries s0 + s1 of the tensor at 200 and the
  // 1-2 pair s1 + s2 at 50, both about 1/150 of the tensor per Mbit/s: balanced.
  PlanOptions o;
  o.count = 3000;
  o.world = 3;
  o.weights = *b;
  auto plan = MakePlan(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(CheckedShardSizes(*plan), (std::vector<size_t>{1999, 1000, 1}));
}

TEST(BalancedShardWeights, TheSlowerDirectionOfAPairCounts) {
  // 0->1 is fast but 1->0 slow: pair 0-1 is the slow one.
  std::vector<uint64_t> r = Symmetric(3, {200, 100, 200});
  r[1 * 3 + 0] = 50;
  auto w = BalancedShardWeights(r, 3);
  ASSERT_TRUE(w.ok());
  // x0 + x1 <= 50, x0 + x2 <= 100, x1 + x2 <= 200: x = (0, 50, 100) beats (25, 25, 75).
  EXPECT_EQ(*w, (std::vector<uint64_t>{1, 100, 200}));
}

TEST(BalancedShardWeights, FourRegionsWithOneSlowRegion) {
  // Region 3's links run at a quarter of the others': it should own (almost) nothing and the
  // others equal shares. Every shard still crosses region 3's links (its part of the shard in
  // phase 1, the result in phase 2), so x_i + x_3 <= 25 caps each x_i at 25: x = (25, 25, 25, 0),
  // 1.5x faster than the even split. Also where the slow region is rank 0 (the result follows
  // the ranks).
  auto w = BalancedShardWeights(Symmetric(4, {100, 100, 25, 100, 25, 25}), 4);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (std::vector<uint64_t>{50, 50, 50, 1}));
  auto first = BalancedShardWeights(Symmetric(4, {25, 25, 25, 100, 100, 100}), 4);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, (std::vector<uint64_t>{1, 50, 50, 50}));
}

TEST(BalancedShardWeights, DegenerateCases) {
  // An unknown (0) rate anywhere: equal weights, whatever the others say.
  std::vector<uint64_t> r = Symmetric(3, {200, 100, 50});
  r[2 * 3 + 1] = 0;
  auto unknown = BalancedShardWeights(r, 3);
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(*unknown, (std::vector<uint64_t>{1, 1, 1}));
  // Two regions: one pair carries everything whatever the split.
  auto two = BalancedShardWeights(Symmetric(2, {100}), 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, (std::vector<uint64_t>{1, 1}));
  std::vector<uint64_t> skew = {0, 1000, 10, 0};
  EXPECT_EQ(*BalancedShardWeights(skew, 2), (std::vector<uint64_t>{1, 1}));
  // The diagonal is ignored.
  std::vector<uint64_t> diag = Symmetric(3, {200, 100, 50});
  diag[0] = 7;
  diag[4] = 123456;
  EXPECT_EQ(*BalancedShardWeights(diag, 3), (std::vector<uint64_t>{200, 100, 1}));
  // Huge rates (far above any link's bytes/s) do not overflow.
  auto huge = BalancedShardWeights(Symmetric(3, {4'000'000'000'000'000, 2'000'000'000'000'000,
                                                 1'000'000'000'000'000}),
                                   3);
  ASSERT_TRUE(huge.ok());
  EXPECT_GT((*huge)[0], (*huge)[1]);
  EXPECT_EQ((*huge)[2], 1u);
  // Bad arguments.
  EXPECT_EQ(BalancedShardWeights({1, 2, 3}, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BalancedShardWeights({}, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(BalancedShardWeights, Deterministic) {
  const std::vector<uint64_t> r = Symmetric(5, {91, 17, 230, 44, 120, 75, 60, 18, 99, 150});
  auto a = BalancedShardWeights(r, 5);
  ASSERT_TRUE(a.ok());
  for (int k = 0; k < 10; ++k) EXPECT_EQ(*BalancedShardWeights(r, 5), *a);
  // Whatever the split, it is never worse than the even one on the busiest link.
  double total = 0;
  for (uint64_t v : *a) total += static_cast<double>(v);
  double busiest = 0, busiest_even = 0;
  for (int i = 0; i < 5; ++i) {
    for (int j = i + 1; j < 5; ++j) {
      const double c = static_cast<double>(r[static_cast<size_t>(i * 5 + j)]);
      busiest = std::max(busiest, static_cast<double>((*a)[static_cast<size_t>(i)] +
                                                      (*a)[static_cast<size_t>(j)]) /
                                      total / c);
      busiest_even = std::max(busiest_even, 0.4 / c);
    }
  }
  EXPECT_LE(busiest, busiest_even * 1.0001);
  if (*a != std::vector<uint64_t>(5, 1)) {
    EXPECT_LE(busiest, busiest_even / 1.05);
  }
}

// Without a configured size, large lossy ops cut small chunks (a shorter store-and-forward tail)
// and everything else 2^18 (NCCL's small concurrent ops, zstd's ratio); the rule depends on
// nothing but the op, so every region's gateways cut alike.
TEST(ChunkElementsFor, SmallChunksOnlyForLargeLossyOps) {
  EXPECT_EQ(ChunkElementsFor(kLargeOpElements, true), kLargeOpChunkElements);
  EXPECT_EQ(ChunkElementsFor(size_t{1} << 26, true), kLargeOpChunkElements);
  EXPECT_EQ(ChunkElementsFor(kLargeOpElements - 1, true), kDefaultChunkElements);
  EXPECT_EQ(ChunkElementsFor(size_t{1} << 20, true), kDefaultChunkElements);  // a CollNet op
  EXPECT_EQ(ChunkElementsFor(size_t{1} << 26, false), kDefaultChunkElements);
  EXPECT_EQ(ChunkElementsFor(0, true), kDefaultChunkElements);
  // A large op still pipelines: many chunks per shard of three regions.
  EXPECT_GE(kLargeOpElements / 3 / kLargeOpChunkElements, 16u);
}

}  // namespace
}  // namespace strait::collective
