// Agreement on a job's policy between regions (see policy.h): the deterministic merge of the
// regions' offers (MergePolicies), the policy control message (version 2, EncodePolicyOffer /
// DecodePolicyOffer) and each gateway's side of the exchange (PolicyAgreement).
//
// Apart from policy.cc because it is a protocol between gateways -- a wire format and a
// waiting, locked object -- where policy.cc is pure functions of one gateway's configuration.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/endian.h"
#include "common/strings.h"
#include "gateway/policy.h"
#include "gateway/policy_internal.h"

namespace strait::gateway {
namespace {

using policy_internal::Allowed;

std::string CodecList(const std::vector<CodecId>& codecs) {
  std::string s = "[";
  for (size_t i = 0; i < codecs.size(); ++i) {
    s += (i ? ", " : "");
    s += CodecName(codecs[i]);
  }
  return s + "]";
}

// The lossless part of a policy: what non-eligible tensors (and fixed lossless jobs) use.
CodecId LosslessOf(const JobPolicy& p) {
  return IsLossyCodec(p.codec) ? p.lossless_fallback : p.codec;
}

constexpr size_t kOfferHeaderBytes = 26;

bool ValidCodecByte(uint8_t v) {
  return v < kNumCodecs;
}

}  // namespace

StatusOr<JobPolicy> MergePolicies(const std::string& job, std::span<const PolicyOffer> offers) {
  if (offers.empty()) return InvalidArgumentError("no policy offers for job \"" + job + "\"");
  // Sorted by region, so that notes (and the first conflicting pair) do not depend on the order
  // the offers arrived in.
  std::vector<const PolicyOffer*> sorted;
  for (const PolicyOffer& o : offers) sorted.push_back(&o);
  std::sort(sorted.begin(), sorted.end(),
            [](const PolicyOffer* a, const PolicyOffer* b) { return a->region < b->region; });

  JobPolicy m;
  m.note.clear();
  // Allowed codecs: the intersection, in CodecId order.
  m.allowed_codecs.clear();
  for (int c = 0; c < kNumCodecs; ++c) {
    const CodecId id = static_cast<CodecId>(c);
    bool everywhere = true;
    for (const PolicyOffer* o : sorted)
      everywhere = everywhere && Allowed(o->policy.allowed_codecs, id);
    if (everywhere) m.allowed_codecs.push_back(id);
  }
  const bool zstd_ok = Allowed(m.allowed_codecs, CodecId::kZstd);
  const bool none_ok = Allowed(m.allowed_codecs, CodecId::kNone);
  if (!zstd_ok && !none_ok) {
    // Name two regions whose lossless codecs do not meet.
    for (const PolicyOffer* a : sorted) {
      for (const PolicyOffer* b : sorted) {
        const auto& x = a->policy.allowed_codecs;
        const auto& y = b->policy.allowed_codecs;
        const bool meet = (Allowed(x, CodecId::kZstd) && Allowed(y, CodecId::kZstd)) ||
                          (Allowed(x, CodecId::kNone) && Allowed(y, CodecId::kNone));
        if (!meet) {
          return FailedPreconditionError(
              "job \"" + job + "\": the regions share no lossless codec: " + a->region +
              " allows " + CodecList(x) + ", " + b->region + " allows " + CodecList(y) +
              "; give every gateway's policy.allowed_codecs a common lossless codec (none or "
              "zstd)");
        }
      }
    }
    return FailedPreconditionError("job \"" + job +
                                   "\": the regions' policy.allowed_codecs share no lossless "
                                   "codec (none or zstd); give them one in common");
  }
  m.max_relative_error = sorted[0]->policy.max_relative_error;
  m.min_lossy_bytes = 0;
  m.automatic = true;
  m.measured_weights = true;
  m.error_feedback = false;
  m.zstd_level = sorted[0]->policy.zstd_level;
  bool all_lossy = true;
  bool any_fixed_zstd = false;
  std::string lossless_region;
  for (const PolicyOffer* o : sorted) {
    const JobPolicy& p = o->policy;
    m.max_relative_error = std::min(m.max_relative_error, p.max_relative_error);
    m.min_lossy_bytes = std::max(m.min_lossy_bytes, p.min_lossy_bytes);
    m.automatic = m.automatic && p.automatic;
    m.measured_weights = m.measured_weights && p.measured_weights;
    m.error_feedback = m.error_feedback || p.error_feedback;
    m.zstd_level = std::min(m.zstd_level, p.zstd_level);
    if (!IsLossyCodec(p.codec)) {
      if (all_lossy) lossless_region = o->region;
      all_lossy = false;
    }
    if (!p.automatic && LosslessOf(p) == CodecId::kZstd) any_fixed_zstd = true;
  }
  m.lossless_fallback =
      zstd_ok && (m.automatic || any_fixed_zstd || !none_ok) ? CodecId::kZstd : CodecId::kNone;
  m.codec = m.lossless_fallback;
  std::ostringstream note;
  if (all_lossy) {
    // The most accurate of the lossy codecs the regions use that every region accepts.
    std::optional<CodecId> best;
    for (const PolicyOffer* o : sorted) {
      const CodecId c = o->policy.codec;
      if (!Allowed(m.allowed_codecs, c) || CodecRelativeErrorBound(c) > m.max_relative_error) {
        continue;
      }
      if (!best || CodecRelativeErrorBound(c) < CodecRelativeErrorBound(*best)) best = c;
    }
    if (best) {
      m.codec = *best;
    } else {
      note << "lossless: no region's lossy codec is allowed (within max_relative_error "
           << m.max_relative_error << ") by every region";
    }
  } else {
    bool someone_lossy = false;
    for (const PolicyOffer* o : sorted)
      someone_lossy = someone_lossy || IsLossyCodec(o->policy.codec);
    if (someone_lossy)
      note << "lossless: " << lossless_region << "'s policy for the job is lossless";
  }
  if (!IsLossyCodec(m.codec)) m.error_feedback = false;
  if (sorted.size() > 1) {
    std::string regions;
    for (const PolicyOffer* o : sorted) AppendToList(regions, o->region);
    m.note = "agreed by " + regions;
    if (!note.str().empty()) m.note += "; " + note.str();
  } else {
    m.note = sorted[0]->policy.note;
  }
  return m;
}

std::vector<uint8_t> EncodePolicyOffer(PolicyMessageKind kind, const std::string& job,
                                       const JobPolicy& policy) {
  const size_t len = std::min(job.size(), kMaxPolicyJobBytes);
  std::vector<uint8_t> b(kOfferHeaderBytes + len, 0);
  b[0] = kPolicyMessageVersion;
  b[1] = static_cast<uint8_t>(kind);
  b[2] = static_cast<uint8_t>((policy.automatic ? 1 : 0) | (policy.error_feedback ? 2 : 0) |
                              (policy.measured_weights ? 4 : 0));
  b[3] = static_cast<uint8_t>(policy.codec);
  b[4] = static_cast<uint8_t>(policy.lossless_fallback);
  b[5] = static_cast<uint8_t>(static_cast<int8_t>(policy.zstd_level));
  uint16_t mask = 0;
  for (CodecId c : policy.allowed_codecs)
    mask = static_cast<uint16_t>(mask | (1u << static_cast<unsigned>(c)));
  PutU16(b.data() + 6, mask);
  PutU64(b.data() + 8, policy.min_lossy_bytes);
  uint64_t bits = 0;
  static_assert(sizeof(double) == sizeof(uint64_t));
  std::memcpy(&bits, &policy.max_relative_error, sizeof(bits));
  PutU64(b.data() + 16, bits);
  PutU16(b.data() + 24, static_cast<uint16_t>(len));
  std::memcpy(b.data() + kOfferHeaderBytes, job.data(), len);
  return b;
}

StatusOr<DecodedPolicyOffer> DecodePolicyOffer(std::span<const uint8_t> m) {
  if (m.size() < kOfferHeaderBytes) {
    return DataLossError("policy message of " + std::to_string(m.size()) +
                         " bytes is shorter than its " + std::to_string(kOfferHeaderBytes) +
                         "-byte header");
  }
  if (m[0] != kPolicyMessageVersion) {
    return DataLossError("policy message version " + std::to_string(m[0]) +
                         " is not supported (this gateway speaks version " +
                         std::to_string(kPolicyMessageVersion) +
                         (m[0] < kPolicyMessageVersion
                              ? ", which carries shard-weight rates on their own link channel"
                              : "") +
                         "); upgrade the older gateway: every region must run a straitd of the "
                         "same policy message version");
  }
  DecodedPolicyOffer d;
  if (m[1] != static_cast<uint8_t>(PolicyMessageKind::kOffer) &&
      m[1] != static_cast<uint8_t>(PolicyMessageKind::kReply)) {
    return DataLossError("policy message: unknown kind " + std::to_string(m[1]));
  }
  d.kind = static_cast<PolicyMessageKind>(m[1]);
  if (!ValidCodecByte(m[3]) || !ValidCodecByte(m[4]) || IsLossyCodec(static_cast<CodecId>(m[4]))) {
    return DataLossError("policy message: invalid codec " + std::to_string(m[3]) + " / fallback " +
                         std::to_string(m[4]));
  }
  JobPolicy& p = d.policy;
  p.automatic = (m[2] & 1) != 0;
  p.error_feedback = (m[2] & 2) != 0;
  p.measured_weights = (m[2] & 4) != 0;
  p.codec = static_cast<CodecId>(m[3]);
  p.lossless_fallback = static_cast<CodecId>(m[4]);
  p.zstd_level = std::clamp<int>(static_cast<int8_t>(m[5]), kMinZstdLevel, kMaxZstdLevel);
  const uint16_t mask = GetU16(m.data() + 6);
  p.allowed_codecs.clear();
  for (int c = 0; c < kNumCodecs; ++c) {
    if (mask & (1u << c)) p.allowed_codecs.push_back(static_cast<CodecId>(c));
  }
  p.min_lossy_bytes = GetU64(m.data() + 8);
  const uint64_t bits = GetU64(m.data() + 16);
  std::memcpy(&p.max_relative_error, &bits, sizeof(bits));
  if (!(p.max_relative_error >= 0 && p.max_relative_error <= 1)) {
    return DataLossError("policy message: max_relative_error out of [0, 1]");
  }
  const size_t len = GetU16(m.data() + 24);
  if (len == 0 || len > kMaxPolicyJobBytes || m.size() != kOfferHeaderBytes + len) {
    return DataLossError("policy message: job length " + std::to_string(len) + " does not match " +
                         std::to_string(m.size()) + " message bytes");
  }
  d.job.assign(reinterpret_cast<const char*>(m.data() + kOfferHeaderBytes), len);
  return d;
}

PolicyAgreement::PolicyAgreement(int rank, std::vector<std::string> world)
    : rank_(rank), world_(std::move(world)) {}

void PolicyAgreement::RemergeLocked(const std::string& job, Job& j) {
  j.merged.reset();
  if (j.offers.size() < world_.size()) return;
  std::vector<PolicyOffer> offers;
  for (const auto& [rank, policy] : j.offers) {
    offers.push_back(PolicyOffer{world_[static_cast<size_t>(rank)], policy});
  }
  j.merged = MergePolicies(job, offers);
  cv_.notify_all();
}

void PolicyAgreement::SetLocal(const std::string& job, const JobPolicy& policy) {
  std::lock_guard<std::mutex> lock(mu_);
  Job& j = jobs_[job];
  j.offers[rank_] = policy;
  RemergeLocked(job, j);
}

StatusOr<std::optional<std::vector<uint8_t>>> PolicyAgreement::OnMessage(
    int peer, std::span<const uint8_t> message) {
  if (peer < 0 || static_cast<size_t>(peer) >= world_.size() || peer == rank_) {
    return InvalidArgumentError("policy message from rank " + std::to_string(peer) +
                                " outside the world");
  }
  StatusOr<DecodedPolicyOffer> decoded = DecodePolicyOffer(message);
  if (!decoded.ok()) {
    // Kept so that a job waiting for this peer's policy says why it never came (e.g. a peer of
    // another version, whose every message is refused).
    std::lock_guard<std::mutex> lock(mu_);
    refusals_[peer] = decoded.status().message();
    return decoded.status();
  }
  DecodedPolicyOffer& d = *decoded;
  std::lock_guard<std::mutex> lock(mu_);
  refusals_.erase(peer);
  Job& j = jobs_[d.job];
  auto it = j.offers.find(peer);
  const bool changed =
      it == j.offers.end() || EncodePolicyOffer(PolicyMessageKind::kOffer, d.job, it->second) !=
                                  EncodePolicyOffer(PolicyMessageKind::kOffer, d.job, d.policy);
  j.offers[peer] = d.policy;
  if (changed) RemergeLocked(d.job, j);
  if (d.kind == PolicyMessageKind::kOffer) {
    auto mine = j.offers.find(rank_);
    if (mine != j.offers.end()) {
      return std::optional<std::vector<uint8_t>>(
          EncodePolicyOffer(PolicyMessageKind::kReply, d.job, mine->second));
    }
  }
  return std::optional<std::vector<uint8_t>>();
}

std::vector<int> PolicyAgreement::Missing(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> missing;
  auto it = jobs_.find(job);
  for (size_t r = 0; r < world_.size(); ++r) {
    if (it == jobs_.end() || it->second.offers.count(static_cast<int>(r)) == 0) {
      missing.push_back(static_cast<int>(r));
    }
  }
  return missing;
}

std::optional<std::vector<uint8_t>> PolicyAgreement::LocalOffer(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return std::nullopt;
  auto mine = it->second.offers.find(rank_);
  if (mine == it->second.offers.end()) return std::nullopt;
  return EncodePolicyOffer(PolicyMessageKind::kOffer, job, mine->second);
}

std::optional<StatusOr<JobPolicy>> PolicyAgreement::Agreed(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return std::nullopt;
  return it->second.merged;
}

StatusOr<JobPolicy> PolicyAgreement::Wait(const std::string& job, Deadline deadline,
                                          const std::function<bool()>& stop) const {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = jobs_.find(job);
    if (it != jobs_.end() && it->second.merged.has_value()) return *it->second.merged;
    if (deadline.Expired() || (stop && stop())) {
      std::string missing;
      std::string refused;
      for (size_t r = 0; r < world_.size(); ++r) {
        if (it == jobs_.end() || it->second.offers.count(static_cast<int>(r)) == 0) {
          AppendToList(missing, world_[r]);
          auto why = refusals_.find(static_cast<int>(r));
          if (why != refusals_.end()) refused += "; " + world_[r] + "'s refused: " + why->second;
        }
      }
      return DeadlineExceededError("job \"" + job + "\": no policy from " + missing +
                                   " before the deadline; register the job in every region (its "
                                   "gateways agree on one policy before the first all-reduce)" +
                                   refused);
    }
    const int64_t wait_ns = std::min<int64_t>(deadline.RemainingNanos(), 50'000'000);
    cv_.wait_for(lock, std::chrono::nanoseconds(wait_ns));
  }
}

}  // namespace strait::gateway
