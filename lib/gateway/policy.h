// Job compression policy: what a job asks for, clamped to what the gateway operator allows.
//
// A job names its policy in one short string (STRAIT_COMPRESSION, or the register-job request):
//   "auto" | "none" | "zstd" | "zstd:<level>" | "int8" | "int4" | "fp8"  then optional ",ef" /
//   ",noef" (error feedback on/off; default from the gateway config). Examples: "int8,ef",
//   "zstd:3", "auto". An empty string means the gateway's default policy.
// The gateway clamps the request to its PolicyLimits: a codec that is not allowed, or a lossy
// codec whose worst-case error exceeds max_relative_error, falls back to the best allowed
// lossless codec (zstd, else none), and the reason is kept so that logs and the job can see it.
// Per tensor, lossy codecs apply only to sum/avg of float32/bfloat16/float16 tensors of at
// least min_lossy_bytes; everything else goes lossless.
// Thread-safe: plain values and pure functions.
#ifndef STRAIT_LIB_GATEWAY_POLICY_H_
#define STRAIT_LIB_GATEWAY_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gateway/config.h"
#include "strait/codec.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::gateway {

// What the job asked for, syntactically valid but not yet clamped.
struct PolicyRequest {
  bool automatic = false;          // "auto"
  CodecId codec = CodecId::kNone;  // when !automatic
  std::optional<int> zstd_level;   // "zstd:<level>"
  std::optional<bool> error_feedback;
};

// Parses a policy string; errors name the bad part and list what is accepted.
StatusOr<PolicyRequest> ParsePolicyRequest(std::string_view text);

// Worst-case quantization error of a lossy codec relative to its block's absmax (0 for lossless
// codecs): int8 1/254, int4 1/14, fp8 e4m3 1/16.
double CodecRelativeErrorBound(CodecId codec);

// A job's policy after clamping: used for every tensor of the job.
struct JobPolicy {
  CodecId codec = CodecId::kZstd;  // the codec for eligible tensors
  int zstd_level = 1;
  bool error_feedback = false;
  uint64_t min_lossy_bytes = 0;
  CodecId lossless_fallback = CodecId::kZstd;  // for tensors that may not go lossy
  std::string note;  // why the request was changed ("" when taken as asked)
  // E.g. "int8+ef (min lossy 64 KiB)" or "zstd:1 (int4 not allowed by gateway: ...)".
  std::string ToString() const;
};

// Clamps `request` (empty string = the operator's default codec) to `limits`. Never fails for a
// syntactically valid request: the operator's limits win and `note` says why.
JobPolicy ClampPolicy(const PolicyRequest& request, const PolicyLimits& limits);
// ParsePolicyRequest + ClampPolicy; an empty text takes the limits' defaults.
StatusOr<JobPolicy> ResolvePolicy(std::string_view text, const PolicyLimits& limits);

// The codec for one tensor under `policy`.
struct TensorCodec {
  CodecOptions codec;
  bool error_feedback = false;
};
TensorCodec ChooseTensorCodec(const JobPolicy& policy, DataType dtype, ReduceOp op,
                              size_t count);

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_POLICY_H_
