// The frame path's policy from the gateway's resolved policy text (see frame_policy.h).
#include "api/frame_policy.h"

#include <string>

#include "common/log.h"
#include "localproto/policy_grammar.h"

namespace strait::api {
namespace {

constexpr std::string_view kEfSuffix = "+ef";

Status NotResolved(std::string_view resolved, const std::string& why) {
  return InvalidArgumentError(
      "the gateway's resolved policy \"" + std::string(resolved) + "\" is not one this library " +
      "reads: " + why +
      " (is straitd a newer version than libstrait? run the same Strait version on both)");
}

}  // namespace

StatusOr<std::optional<FramePolicy>> ParseFramePolicy(std::string_view resolved) {
  // The first word is the policy; after it only JobPolicy::ToString()'s " (details)" and
  // " [note]" may follow.
  const size_t space = resolved.find(' ');
  std::string_view head = resolved.substr(0, space);
  if (space != std::string_view::npos) {
    const std::string_view rest = resolved.substr(space + 1);
    if (rest.empty() || (rest.front() != '(' && rest.front() != '[')) {
      return NotResolved(resolved, "after the policy \"" + std::string(head) + "\" comes \"" +
                                       std::string(rest) + "\", not \"(details)\" or \"[note]\"");
    }
  }
  if (head.empty()) return NotResolved(resolved, "it names no policy");
  // The request grammar's ",ef"/",noef" never appear in resolved text (it says "+ef" or nothing):
  // a comma means the text is a request, not what the gateway resolved.
  if (head.find(',') != std::string_view::npos) {
    return NotResolved(resolved, "\",\" is request syntax; the gateway's reply writes \"+ef\"");
  }
  // Resolved text states error feedback exactly: "+ef" when on, nothing when off (never the
  // gateway's default, which is what a request without ",ef" would mean).
  bool error_feedback = false;
  if (head.size() > kEfSuffix.size() && head.substr(head.size() - kEfSuffix.size()) == kEfSuffix) {
    error_feedback = true;
    head.remove_suffix(kEfSuffix.size());
  }
  auto request = localproto::ParsePolicyRequest(head);
  if (!request.ok()) return NotResolved(resolved, request.status().message());
  // Auto chooses codecs per link inside the gateway, which a frame quantized here cannot follow
  // (the gateway refuses such frames); lossless codecs are the gateway's to apply.
  if (request->automatic || !IsLossyCodec(request->codec)) return std::optional<FramePolicy>();
  return std::optional<FramePolicy>(FramePolicy{request->codec, error_feedback});
}

std::optional<FramePolicy> FramePolicyOf(std::string_view resolved) {
  auto parsed = ParseFramePolicy(resolved);
  if (parsed.ok()) return *parsed;
  STRAIT_LOG(kWarn, "api") << parsed.status().message()
                           << "; sending tensors raw (the gateway applies its policy to them)";
  return std::nullopt;
}

}  // namespace strait::api
