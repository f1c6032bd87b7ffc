// Library mode's frame path (both backends): whether a rank quantizes its shard itself before
// the gateway all-reduces it (local protocol kAllReduceFrame), with which lossy codec, and with
// or without error feedback. It follows the policy the gateway resolved for the job: the text
// localproto::Client::RegisterJob returns, gateway::JobPolicy::ToString(), e.g.
//   "int8+ef (lossy from 64 KiB, else zstd)"          -> int8, error feedback on
//   "fp8 (lossy from 64 KiB, else none) [a note]"     -> fp8, error feedback off
//   "zstd:1", "none", "auto (lossless per link: ...)" -> no frame path (lossless)
//   "auto:int8+ef (lossy from 64 KiB, else ...)"      -> no frame path (auto picks per link,
//                                                        which a pre-quantized frame cannot follow)
// That text's first word is the policy in the grammar of localproto::ParsePolicyRequest, except
// that error feedback is written "+ef" (and left out when off); the rest, after a space, is "(...)"
// details and a "[...]" note. ParseFramePolicy reads the first word with the gateway's own parser,
// so the two cannot drift apart on codec names, levels or auto's forms.
//
// Thread-safe: pure functions.
#ifndef STRAIT_LIB_API_FRAME_POLICY_H_
#define STRAIT_LIB_API_FRAME_POLICY_H_

#include <optional>
#include <string_view>

#include "strait/codec.h"
#include "strait/status.h"

namespace strait::api {

// A fixed lossy policy, as the rank's encoder applies it (default block size, round to nearest).
struct FramePolicy {
  CodecId codec = CodecId::kInt8;  // int8, int4 or fp8
  bool error_feedback = false;
  bool operator==(const FramePolicy&) const = default;
};

// Reads a resolved policy text (see the file comment). A fixed lossy policy gives its
// FramePolicy; a lossless or auto policy gives nullopt (the rank sends tensors raw and the
// gateway encodes them). Text that is not a resolved policy (empty, a request string such as
// "int8,ef", an unknown codec from a newer gateway, trailing words) is kInvalidArgument naming
// the text and the part that is wrong.
StatusOr<std::optional<FramePolicy>> ParseFramePolicy(std::string_view resolved);

// ParseFramePolicy for a backend at comm creation: text it cannot read gives nullopt, with one
// warning log line naming the text. The raw path is correct under any policy (the gateway
// applies the policy itself), so a newer gateway's policy still works, only without the rank's
// own quantization.
std::optional<FramePolicy> FramePolicyOf(std::string_view resolved);

}  // namespace strait::api

#endif  // STRAIT_LIB_API_FRAME_POLICY_H_
