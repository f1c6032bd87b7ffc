// Parsing and clamping of job compression policies (see policy.h).
#include "gateway/policy.h"

#include <algorithm>
#include <charconv>
#include <sstream>
#include <vector>

#include "common/units.h"

namespace strait::gateway {
namespace {

constexpr const char* kPolicyGrammar =
    "accepted: auto, none, zstd, zstd:<level -5..19>, int8, int4, fp8, each optionally followed "
    "by \",ef\" or \",noef\" (e.g. \"int8,ef\", \"zstd:3\")";

bool Allowed(const PolicyLimits& limits, CodecId codec) {
  return std::find(limits.allowed_codecs.begin(), limits.allowed_codecs.end(), codec) !=
         limits.allowed_codecs.end();
}

CodecId BestLossless(const PolicyLimits& limits) {
  return Allowed(limits, CodecId::kZstd) ? CodecId::kZstd : CodecId::kNone;
}

}  // namespace

StatusOr<PolicyRequest> ParsePolicyRequest(std::string_view text) {
  PolicyRequest req;
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t comma = text.find(',', start);
    parts.push_back(text.substr(start, comma == std::string_view::npos ? text.npos
                                                                        : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  const std::string_view head = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i] == "ef") {
      req.error_feedback = true;
    } else if (parts[i] == "noef") {
      req.error_feedback = false;
    } else {
      return InvalidArgumentError("compression policy \"" + std::string(text) +
                                  "\": unknown option \"" + std::string(parts[i]) + "\"; " +
                                  kPolicyGrammar);
    }
  }
  const size_t colon = head.find(':');
  const std::string_view name = head.substr(0, colon);
  if (name == "auto") {
    req.automatic = true;
  } else if (auto id = ParseCodecId(name); id.has_value()) {
    req.codec = *id;
  } else {
    return InvalidArgumentError("compression policy \"" + std::string(text) +
                                "\": unknown codec \"" + std::string(name) + "\"; " +
                                kPolicyGrammar);
  }
  if (colon != std::string_view::npos) {
    const std::string_view level = head.substr(colon + 1);
    int v = 0;
    auto [ptr, ec] = std::from_chars(level.data(), level.data() + level.size(), v);
    if (req.automatic || req.codec != CodecId::kZstd) {
      return InvalidArgumentError("compression policy \"" + std::string(text) +
                                  "\": only zstd takes a level; " + kPolicyGrammar);
    }
    if (ec != std::errc() || ptr != level.data() + level.size() || v < kMinZstdLevel ||
        v > kMaxZstdLevel) {
      return InvalidArgumentError("compression policy \"" + std::string(text) +
                                  "\": bad zstd level \"" + std::string(level) + "\"; " +
                                  kPolicyGrammar);
    }
    req.zstd_level = v;
  }
  return req;
}

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
  os << CodecName(codec);
  if (codec == CodecId::kZstd) os << ":" << zstd_level;
  if (IsLossyCodec(codec)) {
    os << (error_feedback ? "+ef" : "") << " (lossy from " << FormatBytes(min_lossy_bytes)
       << ", else " << CodecName(lossless_fallback) << ")";
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
  CodecId want;
  if (request.automatic) {
    // Until codec choice adapts to each link's bandwidth, auto never goes lossy on its own: a
    // job gets quantized gradients only when it (or the operator's default) names a codec.
    want = p.lossless_fallback;
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

TensorCodec ChooseTensorCodec(const JobPolicy& policy, DataType dtype, ReduceOp op,
                              size_t count) {
  TensorCodec t;
  const uint64_t bytes = uint64_t{count} * DataTypeSize(dtype);
  CodecId codec = policy.codec;
  if (IsLossyCodec(codec)) {
    const bool eligible = IsLossyCodableType(dtype) &&
                          (op == ReduceOp::kSum || op == ReduceOp::kAvg) &&
                          bytes >= policy.min_lossy_bytes;
    if (!eligible) codec = policy.lossless_fallback;
  }
  t.codec.codec = codec;
  t.codec.zstd_level = policy.zstd_level;
  t.error_feedback = IsLossyCodec(codec) && policy.error_feedback;
  return t;
}

}  // namespace strait::gateway
