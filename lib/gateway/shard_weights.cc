// Shard weights from measured link rates (see policy.h, "Shard weights from measured link
// rates"): the rates message (version 2, on kRatesChannel), the hysteresis test (RatesChanged)
// and each gateway's side of the per-round exchange (WeightsAgreement), which turns the agreed
// rate matrix into collective::BalancedShardWeights.
//
// Apart from the policy files because it is about link rates and shard sizes, not codecs; it
// shares only the job-name limit with the policy message.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collective/plan.h"
#include "common/endian.h"
#include "common/strings.h"
#include "gateway/policy.h"

namespace strait::gateway {

namespace {
constexpr size_t kRatesHeaderBytes = 28;
}  // namespace

std::vector<uint8_t> EncodeRatesOffer(const std::string& job, const WeightsRound& round,
                                      const std::vector<uint64_t>& rates) {
  const size_t len = std::min(job.size(), kMaxPolicyJobBytes);
  const size_t n = std::min<size_t>(rates.size(), UINT16_MAX);
  std::vector<uint8_t> b(kRatesHeaderBytes + 8 * n + 2 + len, 0);
  b[0] = kRatesMessageVersion;
  b[1] = static_cast<uint8_t>(PolicyMessageKind::kRates);
  PutU16(b.data() + 2, static_cast<uint16_t>(n));
  PutU64(b.data() + 4, round.world);
  PutU64(b.data() + 12, round.epoch);
  PutU64(b.data() + 20, round.round);
  for (size_t i = 0; i < n; ++i) PutU64(b.data() + kRatesHeaderBytes + 8 * i, rates[i]);
  PutU16(b.data() + kRatesHeaderBytes + 8 * n, static_cast<uint16_t>(len));
  std::memcpy(b.data() + kRatesHeaderBytes + 8 * n + 2, job.data(), len);
  return b;
}

StatusOr<DecodedRatesOffer> DecodeRatesOffer(std::span<const uint8_t> m) {
  if (m.size() < kRatesHeaderBytes + 2) {
    return DataLossError("rates message of " + std::to_string(m.size()) +
                         " bytes is shorter than its " + std::to_string(kRatesHeaderBytes + 2) +
                         "-byte minimum");
  }
  if (m[0] != kRatesMessageVersion) {
    return DataLossError("rates message version " + std::to_string(m[0]) +
                         " is not supported (this gateway speaks version " +
                         std::to_string(kRatesMessageVersion) + "); upgrade the older gateway");
  }
  if (m[1] != static_cast<uint8_t>(PolicyMessageKind::kRates)) {
    return DataLossError("rates message: kind " + std::to_string(m[1]) + " is not kRates (3)");
  }
  const size_t n = GetU16(m.data() + 2);
  if (m.size() < kRatesHeaderBytes + 8 * n + 2) {
    return DataLossError("rates message: " + std::to_string(n) + " rates do not fit in " +
                         std::to_string(m.size()) + " bytes");
  }
  const size_t len = GetU16(m.data() + kRatesHeaderBytes + 8 * n);
  if (len == 0 || len > kMaxPolicyJobBytes || m.size() != kRatesHeaderBytes + 8 * n + 2 + len) {
    return DataLossError("rates message: job length " + std::to_string(len) +
                         " does not match " + std::to_string(m.size()) + " message bytes");
  }
  DecodedRatesOffer d;
  d.round.world = GetU64(m.data() + 4);
  d.round.epoch = GetU64(m.data() + 12);
  d.round.round = GetU64(m.data() + 20);
  d.rates.resize(n);
  for (size_t i = 0; i < n; ++i) d.rates[i] = GetU64(m.data() + kRatesHeaderBytes + 8 * i);
  d.job.assign(reinterpret_cast<const char*>(m.data() + kRatesHeaderBytes + 8 * n + 2), len);
  return d;
}

bool RatesChanged(const std::vector<uint64_t>& base, const std::vector<uint64_t>& now,
                  uint64_t percent) {
  if (base.size() != now.size()) return true;
  size_t n = 0;
  while (n * n < base.size()) ++n;
  __extension__ typedef unsigned __int128 u128;
  for (size_t k = 0; k < base.size(); ++k) {
    if (n * n == base.size() && k / n == k % n) continue;  // the diagonal
    const uint64_t a = base[k], b = now[k];
    if ((a == 0) != (b == 0)) return true;
    const uint64_t diff = a > b ? a - b : b - a;
    if (static_cast<u128>(diff) * 100 > static_cast<u128>(a) * percent) return true;
  }
  return false;
}

WeightsAgreement::WeightsAgreement(int rank, int world_size) : rank_(rank), size_(world_size) {}

void WeightsAgreement::PruneLocked(Job& j) {
  // The round first heard of longest ago goes first (rounds of a new epoch or world start again
  // at 0, so round numbers alone would drop the newest).
  for (const auto& [round, rows] : j.rates) {
    if (j.added.emplace(round, j.next_added).second) ++j.next_added;
  }
  while (j.rates.size() > kKeptRounds) {
    auto oldest = j.added.begin();
    for (auto it = j.added.begin(); it != j.added.end(); ++it) {
      if (it->second < oldest->second) oldest = it;
    }
    j.rates.erase(oldest->first);
    j.added.erase(oldest);
  }
  while (j.computed.size() > kKeptRounds) j.computed.erase(j.computed.begin());
}

std::optional<std::vector<uint8_t>> WeightsAgreement::Offer(const std::string& job,
                                                            const WeightsRound& round,
                                                            std::vector<uint64_t> rates) {
  rates.resize(static_cast<size_t>(size_), 0);
  rates[static_cast<size_t>(rank_)] = 0;
  std::lock_guard<std::mutex> lock(mu_);
  Job& j = jobs_[job];
  auto& rows = j.rates[round];
  if (rows.count(rank_) != 0) return std::nullopt;
  rows[rank_] = rates;
  PruneLocked(j);
  cv_.notify_all();
  return EncodeRatesOffer(job, round, rates);
}

std::optional<std::vector<uint8_t>> WeightsAgreement::LocalOffer(const std::string& job,
                                                                 const WeightsRound& round) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return std::nullopt;
  auto r = j->second.rates.find(round);
  if (r == j->second.rates.end()) return std::nullopt;
  auto mine = r->second.find(rank_);
  if (mine == r->second.end()) return std::nullopt;
  return EncodeRatesOffer(job, round, mine->second);
}

Status WeightsAgreement::OnMessage(int peer, std::span<const uint8_t> message) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return InvalidArgumentError("rates message from rank " + std::to_string(peer) +
                                " outside the world");
  }
  STRAIT_ASSIGN_OR_RETURN(DecodedRatesOffer d, DecodeRatesOffer(message));
  if (d.rates.size() != static_cast<size_t>(size_)) {
    return DataLossError("rates message for job \"" + d.job + "\" carries " +
                         std::to_string(d.rates.size()) + " rates for a world of " +
                         std::to_string(size_) + " regions; do the gateways' configs agree on "
                         "the regions?");
  }
  d.rates[static_cast<size_t>(peer)] = 0;
  std::lock_guard<std::mutex> lock(mu_);
  Job& j = jobs_[d.job];
  auto& rows = j.rates[d.round];
  if (rows.emplace(peer, std::move(d.rates)).second) {
    PruneLocked(j);
    cv_.notify_all();
  }
  return Status::Ok();
}

std::vector<int> WeightsAgreement::Missing(const std::string& job,
                                           const WeightsRound& round) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> missing;
  const std::map<int, std::vector<uint64_t>>* rows = nullptr;
  if (auto j = jobs_.find(job); j != jobs_.end()) {
    if (auto r = j->second.rates.find(round); r != j->second.rates.end()) rows = &r->second;
  }
  for (int p = 0; p < size_; ++p) {
    if (rows == nullptr || rows->count(p) == 0) missing.push_back(p);
  }
  return missing;
}

StatusOr<std::vector<uint64_t>> WeightsAgreement::Weights(const std::string& job,
                                                          const WeightsRound& round,
                                                          Deadline deadline,
                                                          const std::function<bool()>& stop) {
  const size_t n = static_cast<size_t>(size_);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    Job& j = jobs_[job];
    if (j.world == round.world && j.epoch == round.epoch) {
      if (auto c = j.computed.find(round.round); c != j.computed.end()) return c->second;
    }
    auto r = j.rates.find(round);
    if (r != j.rates.end() && r->second.size() == n) break;
    if (deadline.Expired() || (stop && stop())) {
      std::string missing;
      for (int p = 0; p < size_; ++p) {
        if (r == j.rates.end() || r->second.count(p) == 0) {
          AppendToList(missing, std::to_string(p));
        }
      }
      return DeadlineExceededError("job \"" + job + "\": no link rates for weights round " +
                                   std::to_string(round.round) + " from rank(s) " + missing +
                                   " (their gateways have not reached this operation, or are "
                                   "unreachable)");
    }
    cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
  Job& j = jobs_[job];
  const auto& rows = j.rates[round];
  std::vector<uint64_t> matrix(n * n, 0);
  for (const auto& [rank, row] : rows) {
    for (size_t c = 0; c < n; ++c) {
      if (c != static_cast<size_t>(rank)) matrix[static_cast<size_t>(rank) * n + c] = row[c];
    }
  }
  auto compute = [&](const std::vector<uint64_t>& m) {
    auto w = collective::BalancedShardWeights(m, size_);
    std::vector<uint64_t> out = w.ok() ? *w : std::vector<uint64_t>();
    if (std::all_of(out.begin(), out.end(), [](uint64_t v) { return v == 1; })) out.clear();
    return out;
  };
  std::vector<uint64_t> weights;
  if (j.world != round.world || j.epoch != round.epoch) {
    // A new (world, epoch): a new chain, starting from this round's rates.
    j.world = round.world;
    j.epoch = round.epoch;
    j.computed.clear();
    j.base = matrix;
    j.base_weights = compute(matrix);
    weights = j.base_weights;
  } else if (j.computed.empty() || round.round > j.computed.rbegin()->first) {
    if (RatesChanged(j.base, matrix, kWeightsChangePercent)) {
      j.base = matrix;
      j.base_weights = compute(matrix);
    }
    weights = j.base_weights;
  } else {
    // An older round than the chain's latest that this gateway never computed (its operations
    // of that round all failed before): its own rates alone. Rare; a mismatch with a peer's
    // chain fails by the operation id, never a wrong sum.
    weights = compute(matrix);
  }
  j.computed[round.round] = weights;
  PruneLocked(j);
  return weights;
}

}  // namespace strait::gateway
