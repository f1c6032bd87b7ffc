// MakePlan: shard split by largest remainder in 128-bit integer arithmetic (no floating point,
// so that ranks on different CPUs and compilers agree), then fixed-size chunks per shard.
#include "collective/plan.h"

#include <algorithm>
#include <string>

#include "collective/transport.h"

namespace strait::collective {
namespace {

bool HasLink(const PlanOptions& o, int from, int to) {
  if (o.links.empty()) return true;
  return o.links[static_cast<size_t>(from) * static_cast<size_t>(o.world) +
                 static_cast<size_t>(to)] != 0;
}

Status MissingLink(int from, int to, Algorithm algorithm) {
  return FailedPreconditionError("the " + std::string(AlgorithmName(algorithm)) +
                                 " all-reduce needs a link from rank " + std::to_string(from) +
                                 " to rank " + std::to_string(to) +
                                 ", which the topology lacks; bring the link up or choose "
                                 "another algorithm");
}

StatusOr<Algorithm> ChooseAlgorithm(const PlanOptions& o) {
  Status mesh_missing;
  for (int i = 0; i < o.world && mesh_missing.ok(); ++i) {
    for (int j = 0; j < o.world; ++j) {
      if (i != j && !HasLink(o, i, j)) {
        mesh_missing = MissingLink(i, j, Algorithm::kMesh);
        break;
      }
    }
  }
  Status ring_missing;
  for (int i = 0; i < o.world; ++i) {
    const int next = (i + 1) % o.world;
    if (next != i && !HasLink(o, i, next)) {
      ring_missing = MissingLink(i, next, Algorithm::kRing);
      break;
    }
  }
  switch (o.algorithm) {
    case Algorithm::kMesh:
      if (!mesh_missing.ok()) return mesh_missing;
      return Algorithm::kMesh;
    case Algorithm::kRing:
      if (!ring_missing.ok()) return ring_missing;
      return Algorithm::kRing;
    case Algorithm::kAuto:
      if (mesh_missing.ok()) return Algorithm::kMesh;
      if (ring_missing.ok()) return Algorithm::kRing;
      return ring_missing.WithContext("neither a full mesh nor a ring is available");
  }
  return InvalidArgumentError("invalid algorithm value " +
                              std::to_string(static_cast<int>(o.algorithm)));
}

// Splits `units` among the owners: one each, the rest in proportion to the weights.
std::vector<size_t> SplitUnits(size_t units, const std::vector<uint64_t>& weights) {
  const size_t n = weights.size();
  std::vector<size_t> share(n, 0);
  if (units < n) {
    for (size_t i = 0; i < units; ++i) share[i] = 1;
    return share;
  }
  // 64-bit units times 64-bit weights need 128 bits; __extension__ keeps -Wpedantic quiet.
  __extension__ typedef unsigned __int128 u128;
  u128 total = 0;
  for (uint64_t w : weights) total += w;
  const size_t rest = units - n;
  size_t given = 0;
  std::vector<u128> remainder(n);
  for (size_t i = 0; i < n; ++i) {
    const u128 product = static_cast<u128>(rest) * weights[i];
    share[i] = 1 + static_cast<size_t>(product / total);
    remainder[i] = product % total;
    given += share[i] - 1;
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return remainder[a] > remainder[b]; });
  for (size_t k = 0; given < rest; ++k, ++given) ++share[order[k]];
  return share;
}

}  // namespace

const char* AlgorithmName(Algorithm algorithm) noexcept {
  switch (algorithm) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kMesh: return "mesh";
    case Algorithm::kRing: return "ring";
  }
  return "invalid";
}

StatusOr<Plan> MakePlan(const PlanOptions& o) {
  if (o.world < 1) {
    return InvalidArgumentError("plan: world size " + std::to_string(o.world) +
                                " must be at least 1");
  }
  const size_t n = static_cast<size_t>(o.world);
  if (!o.weights.empty() && o.weights.size() != n) {
    return InvalidArgumentError("plan: " + std::to_string(o.weights.size()) +
                                " shard weights for " + std::to_string(n) +
                                " ranks; give one per rank, or none for an even split");
  }
  for (size_t i = 0; i < o.weights.size(); ++i) {
    if (o.weights[i] == 0) {
      return InvalidArgumentError("plan: shard weight of rank " + std::to_string(i) +
                                  " is 0; weights are bandwidth estimates and must be positive");
    }
  }
  if (o.align == 0 || o.chunk_elements == 0) {
    return InvalidArgumentError("plan: align and chunk_elements must be at least 1");
  }
  if (!o.links.empty() && o.links.size() != n * n) {
    return InvalidArgumentError("plan: links must hold world*world = " + std::to_string(n * n) +
                                " entries, not " + std::to_string(o.links.size()));
  }
  STRAIT_ASSIGN_OR_RETURN(Algorithm algorithm, ChooseAlgorithm(o));

  Plan plan;
  plan.algorithm = algorithm;
  plan.world = o.world;
  plan.count = o.count;
  const size_t aligned_units = (o.count + o.align - 1) / o.align;
  plan.align = aligned_units >= n ? o.align : 1;
  const size_t units = (o.count + plan.align - 1) / plan.align;
  plan.chunk_elements = (o.chunk_elements + plan.align - 1) / plan.align * plan.align;

  const std::vector<uint64_t> weights = o.weights.empty() ? std::vector<uint64_t>(n, 1) : o.weights;
  const std::vector<size_t> share = SplitUnits(units, weights);
  plan.shards.resize(n);
  size_t begin = 0;
  size_t total_chunks = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t end = std::min(o.count, begin + share[i] * plan.align);
    plan.shards[i] = Shard{begin, end - begin};
    total_chunks += (end - begin + plan.chunk_elements - 1) / plan.chunk_elements;
    begin = end;
  }
  // Checked before anything is allocated: a tiny chunk size on a huge tensor must fail fast.
  if (total_chunks > kMaxTagChunks) {
    return InvalidArgumentError("plan: " + std::to_string(total_chunks) + " chunks of " +
                                std::to_string(plan.chunk_elements) + " elements exceed the " +
                                std::to_string(kMaxTagChunks) +
                                " a tag can number; raise "
                                "chunk_elements");
  }
  plan.chunks.reserve(total_chunks);
  plan.first_chunk.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    plan.first_chunk[i] = static_cast<uint32_t>(plan.chunks.size());
    const size_t end = plan.shards[i].begin + plan.shards[i].count;
    for (size_t at = plan.shards[i].begin; at < end; at += plan.chunk_elements) {
      plan.chunks.push_back(Chunk{static_cast<int>(i), static_cast<uint32_t>(plan.chunks.size()),
                                  at, std::min(plan.chunk_elements, end - at)});
    }
  }
  plan.first_chunk[n] = static_cast<uint32_t>(plan.chunks.size());
  return plan;
}

}  // namespace strait::collective
