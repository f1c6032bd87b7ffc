// Job compression policies, one gateway's side (see policy.h): the codecs' error bounds, a
// policy's one-line description, and clamping a job's request (the grammar of
// localproto/policy_grammar.h) to the operator's PolicyLimits.
//
// The rest of policy.h lives by concern in codec_choice.cc (the codec per tensor and per link,
// `auto`), policy_agreement.cc (merging the regions' policies, the policy message) and
// shard_weights.cc (shard weights from the regions' measured link rates).
#include "gateway/policy.h"

#include <sstream>
#include <string>

#include "common/units.h"
#include "gateway/policy_internal.h"

namespace strait::gateway {
namespace {

using policy_internal::Allowed;

bool Allowed(const PolicyLimits& limits, CodecId codec) {
  return Allowed(limits.allowed_codecs, codec);
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

}  // namespace strait::gateway
