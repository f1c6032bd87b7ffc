// Parsing and clamping of job compression policies (see policy.h).
#include "common/strings.h"
#include "gateway/policy.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "collective/plan.h"
#include "common/endian.h"
#include "common/units.h"

namespace strait::gateway {
namespace {

bool Allowed(const std::vector<CodecId>& codecs, CodecId codec) {
  return std::find(codecs.begin(), codecs.end(), codec) != codecs.end();
}

bool Allowed(const PolicyLimits& limits, CodecId codec) {
  return Allowed(limits.allowed_codecs, codec);
}

bool LossyEligible(const JobPolicy& policy, DataType dtype, ReduceOp op, size_t count) {
  const uint64_t bytes = uint64_t{count} * DataTypeSize(dtype);
  return IsLossyCodableType(dtype) && (op == ReduceOp::kSum || op == ReduceOp::kAvg) &&
         bytes >= policy.min_lossy_bytes;
}

CodecId BestLossless(const PolicyLimits& limits) {
  return Allowed(limits, CodecId::kZstd) ? CodecId::kZstd : CodecId::kNone;
}

}  // namespace

double CodecRelativeErrorBound(CodecId codec) {
  switch (codec) {
    case CodecId::kInt8: return 1.0 / 254.0;
    case CodecId::kInt4: return 1.0 / 14.0;
    case CodecId::kFp8E4M3: return 1.0 / 16.0;
    default: return 0.0;
  }
}

std::string JobPolicy::ToString() const {
  std::ostringstream os;
  if (automatic) {
    os << "auto";
    if (IsLossyCodec(codec)) {
      os << ":" << CodecName(codec) << (error_feedback ? "+ef" : "") << " (lossy from "
         << FormatBytes(min_lossy_bytes) << ", else lossless per link:";
    } else {
      os << " (lossless per link:";
    }
    const char* sep = " ";
    for (CodecId c : allowed_codecs) {
      if (IsLossyCodec(c)) continue;
      os << sep << CodecName(c);
      if (c == CodecId::kZstd) os << ":" << zstd_level;
      sep = ", ";
    }
    os << ")";
  } else {
    os << CodecName(codec);
    if (codec == CodecId::kZstd) os << ":" << zstd_level;
    if (IsLossyCodec(codec)) {
      os << (error_feedback ? "+ef" : "") << " (lossy from " << FormatBytes(min_lossy_bytes)
         << ", else " << CodecName(lossless_fallback) << ")";
    }
  }
  if (!note.empty()) os << " [" << note << "]";
  return os.str();
}

JobPolicy ClampPolicy(const PolicyRequest& request, const PolicyLimits& limits) {
  JobPolicy p;
  p.min_lossy_bytes = limits.min_lossy_bytes;
  p.lossless_fallback = BestLossless(limits);
  p.zstd_level = request.zstd_level.value_or(1);
  p.error_feedback = request.error_feedback.value_or(limits.default_error_feedback);
  p.automatic = request.automatic;
  p.allowed_codecs = limits.allowed_codecs;
  p.max_relative_error = limits.max_relative_error;
  CodecId want;
  if (request.automatic) {
    // Plain auto stays lossless (per link); auto:<lossy> may also pick that codec.
    want = request.auto_lossy.value_or(p.lossless_fallback);
  } else {
    want = request.codec;
  }
  if (!Allowed(limits, want)) {
    p.note = std::string(CodecName(want)) + " not allowed by the gateway's policy.allowed_codecs";
    want = p.lossless_fallback;
  } else if (CodecRelativeErrorBound(want) > limits.max_relative_error) {
    std::ostringstream os;
    os << CodecName(want) << " error bound " << CodecRelativeErrorBound(want)
       << " exceeds the gateway's policy.max_relative_error " << limits.max_relative_error;
    p.note = os.str();
    want = p.lossless_fallback;
  }
  p.codec = want;
  if (!IsLossyCodec(p.codec)) p.error_feedback = false;
  return p;
}

StatusOr<JobPolicy> ResolvePolicy(std::string_view text, const PolicyLimits& limits) {
  if (text.empty()) {
    // The operator's default was validated with the config; parse it the same way.
    STRAIT_ASSIGN_OR_RETURN(PolicyRequest req, ParsePolicyRequest(limits.default_codec));
    return ClampPolicy(req, limits);
  }
  STRAIT_ASSIGN_OR_RETURN(PolicyRequest req, ParsePolicyRequest(text));
  return ClampPolicy(req, limits);
}

TensorCodec ChooseTensorCodec(const JobPolicy& policy, DataType dtype, ReduceOp op, size_t count) {
  TensorCodec t;
  CodecId codec = policy.codec;
  if (IsLossyCodec(codec) && !LossyEligible(policy, dtype, op, count)) {
    codec = policy.lossless_fallback;
  }
  t.codec.codec = codec;
  t.codec.zstd_level = policy.zstd_level;
  t.error_feedback = IsLossyCodec(codec) && policy.error_feedback;
  return t;
}

TensorCodec ChooseLinkCodecs(const JobPolicy& policy, DataType dtype, ReduceOp op, size_t count,
                             int self, std::span<const net::LinkEstimates> links,
                             std::span<const net::CodecProfile> profiles,
                             double fallback_bytes_per_s) {
  TensorCodec t = ChooseTensorCodec(policy, dtype, op, count);
  if (!policy.automatic) return t;
  const size_t world = links.size();
  // Candidates: the allowed lossless codecs, plus the lossy one where the tensor may go lossy.
  std::vector<CodecId> lossless;
  for (CodecId c : policy.allowed_codecs) {
    if (!IsLossyCodec(c)) lossless.push_back(c);
  }
  if (lossless.empty()) lossless.push_back(policy.lossless_fallback);
  std::vector<CodecId> all = lossless;
  if (IsLossyCodec(t.codec.codec)) all.push_back(t.codec.codec);
  const bool raw_allowed = Allowed(lossless, CodecId::kNone);
  // Raw is what ChooseCodec falls back to; where the operator does not allow it, the allowed
  // lossless codec stands in (zstd: it costs CPU but never goes beyond what the policy permits).
  auto allowed_or = [&](CodecId c) {
    return c == CodecId::kNone && !raw_allowed ? CodecId::kZstd : c;
  };
  std::vector<net::CodecProfile> typed;
  for (const net::CodecProfile& p : profiles) typed.push_back(net::ProfileFor(p, dtype));
  const uint64_t bytes = uint64_t{count} * DataTypeSize(dtype);
  // A rank's frames to itself never touch the network: the cheapest codec.
  const CodecId local = raw_allowed ? CodecId::kNone : CodecId::kZstd;

  t.send_codecs.assign(world, local);
  t.result_codecs.assign(world, local);
  int slowest = -1;
  double slowest_bw = 0;
  for (size_t p = 0; p < world; ++p) {
    if (static_cast<int>(p) == self) continue;
    const net::LinkEstimates& e = links[p];
    const double bw = e.goodput_bytes_per_s > 0 ? e.goodput_bytes_per_s : fallback_bytes_per_s;
    if (slowest < 0 || bw < slowest_bw) {
      slowest = static_cast<int>(p);
      slowest_bw = bw;
    }
    t.send_codecs[p] =
        allowed_or(net::ChooseCodec(e, typed, all, bytes, fallback_bytes_per_s).codec);
    t.result_codecs[p] =
        allowed_or(net::ChooseCodec(e, typed, lossless, bytes, fallback_bytes_per_s).codec);
  }
  if (slowest >= 0 && IsLossyCodec(t.codec.codec)) {
    const CodecId on_slowest = net::ChooseCodec(links[static_cast<size_t>(slowest)], typed, all,
                                                bytes, fallback_bytes_per_s)
                                   .codec;
    // The whole step waits for the slowest link: if the lossy codec pays there, the owner's
    // result goes lossy, as one frame for everyone (itself included).
    if (IsLossyCodec(on_slowest)) t.result_codecs.assign(world, on_slowest);
  }
  t.accept_codecs = all;
  bool any_lossy = false;
  for (size_t p = 0; p < world; ++p) {
    any_lossy = any_lossy || IsLossyCodec(t.send_codecs[p]) || IsLossyCodec(t.result_codecs[p]);
  }
  t.error_feedback = any_lossy && policy.error_feedback;
  return t;
}

std::string TensorCodec::ToString() const {
  if (send_codecs.empty()) return CodecName(codec.codec);
  std::string s = "auto: send";
  const char* sep = " ";
  for (CodecId c : send_codecs) {
    s += sep;
    s += CodecName(c);
    sep = "/";
  }
  s += ", result";
  sep = " ";
  for (CodecId c : result_codecs) {
    s += sep;
    s += CodecName(c);
    sep = "/";
  }
  return s;
}

// ---- Agreement ----------------------------------------------------------------------------------

namespace {

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

namespace {

constexpr size_t kOfferHeaderBytes = 26;

bool ValidCodecByte(uint8_t v) {
  return v < kNumCodecs;
}

}  // namespace

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

// ---- Shard weights from measured link rates ----------------------------------------------------

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
