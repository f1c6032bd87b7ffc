// The compression-policy grammar: the one parser of the short strings a job names its policy with
// (STRAIT_COMPRESSION, the register-job request, a gateway's policy.default_codec), used by
// straitd, the NCCL plugin (its STRAIT_COMPRESSION check and CollNet handle) and library mode.
//
//   policy  := head ("," option)*
//   head    := "auto" | "auto:" lossy | codec | "zstd:" level
//   codec   := "none" | "zstd" | lossy            (any case; fp8 also as fp8e4m3, e4m3, fp8_e4m3)
//   lossy   := "int8" | "int4" | "fp8"
//   level   := an integer from kMinZstdLevel to kMaxZstdLevel (-5..19)
//   option  := "ef" | "noef"                      (error feedback on/off; last one wins)
// Examples: "none", "zstd", "zstd:3", "int8", "int8,ef", "auto", "auto:int8", "auto:fp8,noef".
// The empty string is not a policy (a gateway reads it as "its default"; see gateway/policy.h).
// Codecs are strait::CodecId (strait/types.h), the one numbering of codecs.
//
// What a request means once a gateway clamps it to its operator's limits is gateway/policy.h's
// business; this file only says what is well-formed. Thread-safe: pure functions.
#ifndef STRAIT_LIB_LOCALPROTO_POLICY_GRAMMAR_H_
#define STRAIT_LIB_LOCALPROTO_POLICY_GRAMMAR_H_

#include <optional>
#include <string>
#include <string_view>

#include "strait/status.h"
#include "strait/types.h"

namespace strait::localproto {

// What the job asked for, syntactically valid but not yet clamped.
struct PolicyRequest {
  bool automatic = false;             // "auto" / "auto:<lossy>"
  CodecId codec = CodecId::kNone;     // when !automatic
  std::optional<CodecId> auto_lossy;  // "auto:<lossy>": the lossy codec auto may pick
  std::optional<int> zstd_level;      // "zstd:<level>"
  std::optional<bool> error_feedback;
  bool operator==(const PolicyRequest&) const = default;
};

// What every error message of the grammar lists as accepted.
extern const char kPolicyGrammar[];

// Parses a policy string; kInvalidArgument naming the bad part and listing what is accepted.
StatusOr<PolicyRequest> ParsePolicyRequest(std::string_view text);

// The canonical text of a request (lower case, codec names as CodecName gives them, the level
// and the error-feedback option only where given): ParsePolicyRequest of it gives `request` back.
// At most kMaxCanonicalPolicyBytes bytes.
std::string FormatPolicyRequest(const PolicyRequest& request);
inline constexpr size_t kMaxCanonicalPolicyBytes = 16;  // "auto:int8,noef", "zstd:-5,noef"

// Whether the request may make a gateway quantize: a fixed lossy codec, or auto:<lossy>.
bool MayGoLossy(const PolicyRequest& request);

}  // namespace strait::localproto

#endif  // STRAIT_LIB_LOCALPROTO_POLICY_GRAMMAR_H_
