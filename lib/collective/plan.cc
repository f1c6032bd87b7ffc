// MakePlan: shard split by largest remainder in 128-bit integer arithmetic (no floating point,
// so that ranks on different CPUs and compilers agree), then fixed-size chunks per shard.
// BalancedShardWeights: the busiest-link linear program (plan.h), snapped to integers.
#include "collective/plan.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

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

StatusOr<std::vector<uint64_t>> BalancedShardWeights(const std::vector<uint64_t>& rates,
                                                     int world) {
  if (world < 1) {
    return InvalidArgumentError("shard weights: world size " + std::to_string(world) +
                                " must be at least 1");
  }
  const size_t n = static_cast<size_t>(world);
  if (rates.size() != n * n) {
    return InvalidArgumentError("shard weights: the rate matrix must hold world*world = " +
                                std::to_string(n * n) + " entries, not " +
                                std::to_string(rates.size()));
  }
  const std::vector<uint64_t> equal(n, 1);
  if (n <= 2) return equal;
  // Pair capacities: the slower direction; any unknown rate means nothing to balance on.
  std::vector<std::pair<size_t, size_t>> pairs;
  std::vector<uint64_t> cap;
  uint64_t cap_max = 0, cap_min = UINT64_MAX;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      const uint64_t c = std::min(rates[i * n + j], rates[j * n + i]);
      if (c == 0) return equal;
      pairs.emplace_back(i, j);
      cap.push_back(c);
      cap_max = std::max(cap_max, c);
      cap_min = std::min(cap_min, c);
    }
  }
  // Dense simplex on capacities scaled to <= 1 (so the tableau's numbers stay near 1): x, then
  // one slack per pair, then the right-hand side. The origin is feasible: no first phase.
  const double scale = static_cast<double>(cap_max);
  const size_t m = pairs.size(), cols = n + m;
  std::vector<std::vector<double>> a(m + 1, std::vector<double>(cols + 1, 0.0));
  std::vector<size_t> basis(m);
  for (size_t r = 0; r < m; ++r) {
    a[r][pairs[r].first] = 1;
    a[r][pairs[r].second] = 1;
    a[r][n + r] = 1;
    a[r][cols] = static_cast<double>(cap[r]) / scale;
    basis[r] = n + r;
  }
  for (size_t j = 0; j < n; ++j) a[m][j] = -1;  // the objective row: z - sum(x) = 0
  constexpr double kEps = 1e-12;
  for (int iter = 0; iter < 100000; ++iter) {
    size_t enter = cols;  // Bland: the lowest improving column (no cycling)
    for (size_t j = 0; j < cols && enter == cols; ++j) {
      if (a[m][j] < -kEps) enter = j;
    }
    if (enter == cols) break;  // optimal
    size_t leave = m;
    double best = 0;
    for (size_t r = 0; r < m; ++r) {
      if (a[r][enter] <= kEps) continue;
      const double ratio = a[r][cols] / a[r][enter];
      if (leave == m || ratio < best - kEps ||
          (std::fabs(ratio - best) <= kEps && basis[r] < basis[leave])) {
        leave = r;
        best = ratio;
      }
    }
    if (leave == m) break;  // unbounded: impossible, every x_i is in a capped pair
    const double pivot = a[leave][enter];
    for (double& v : a[leave]) v /= pivot;
    for (size_t r = 0; r <= m; ++r) {
      if (r == leave || a[r][enter] == 0) continue;
      const double factor = a[r][enter];
      for (size_t j = 0; j <= cols; ++j) a[r][j] -= factor * a[leave][j];
    }
    basis[leave] = enter;
  }
  // Snap to the half-integral vertex: w_i = 2 x_i in the rates' unit, at least 1.
  std::vector<uint64_t> w(n, 1);
  for (size_t r = 0; r < m; ++r) {
    if (basis[r] >= n) continue;
    // Clamped below 2^64 (rates that large are not link rates; they must only not overflow).
    const double twice = std::min(2.0 * std::max(0.0, a[r][cols]) * scale, 1.8e19);
    w[basis[r]] = std::max<uint64_t>(1, static_cast<uint64_t>(std::floor(twice + 0.5)));
  }
  // Worth it only when the busiest link gets kBalancedMinGainPercent faster than with the even
  // split: T_even = (2/n) / cap_min, T = 1 / sum(x) = 2 / sum(w), so the condition is
  // sum(w) * 100 >= (100 + gain) * n * cap_min.
  __extension__ typedef unsigned __int128 u128;
  u128 total = 0;
  for (uint64_t v : w) total += v;
  if (total * 100 < static_cast<u128>(100 + kBalancedMinGainPercent) * n * cap_min) return equal;
  return w;
}

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
  if (total_chunks > kCommitChunk) {
    return InvalidArgumentError("plan: " + std::to_string(total_chunks) + " chunks of " +
                                std::to_string(plan.chunk_elements) + " elements exceed the " +
                                std::to_string(kCommitChunk) +
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
