// The compression-policy grammar (see policy_grammar.h).
#include "localproto/policy_grammar.h"

#include <charconv>
#include <vector>

namespace strait::localproto {

const char kPolicyGrammar[] =
    "accepted: auto, none, zstd, zstd:<level -5..19>, int8, int4, fp8, auto:<int8|int4|fp8> "
    "(auto that may also pick that lossy codec), each optionally followed by \",ef\" or "
    "\",noef\" (e.g. \"int8,ef\", \"zstd:3\", \"auto:int8\")";

StatusOr<PolicyRequest> ParsePolicyRequest(std::string_view text) {
  PolicyRequest req;
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t comma = text.find(',', start);
    parts.push_back(
        text.substr(start, comma == std::string_view::npos ? text.npos : comma - start));
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
  if (colon != std::string_view::npos && req.automatic) {
    const std::string_view lossy = head.substr(colon + 1);
    auto id = ParseCodecId(lossy);
    if (!id.has_value() || !IsLossyCodec(*id)) {
      return InvalidArgumentError("compression policy \"" + std::string(text) +
                                  "\": auto takes a lossy codec (int8, int4, fp8), not \"" +
                                  std::string(lossy) + "\"; " + kPolicyGrammar);
    }
    req.auto_lossy = *id;
  } else if (colon != std::string_view::npos) {
    const std::string_view level = head.substr(colon + 1);
    int v = 0;
    auto [ptr, ec] = std::from_chars(level.data(), level.data() + level.size(), v);
    if (req.codec != CodecId::kZstd) {
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

std::string FormatPolicyRequest(const PolicyRequest& request) {
  std::string out;
  if (request.automatic) {
    out = "auto";
    if (request.auto_lossy.has_value()) out += std::string(":") + CodecName(*request.auto_lossy);
  } else {
    out = CodecName(request.codec);
    if (request.zstd_level.has_value()) out += ":" + std::to_string(*request.zstd_level);
  }
  if (request.error_feedback.has_value()) out += *request.error_feedback ? ",ef" : ",noef";
  return out;
}

bool MayGoLossy(const PolicyRequest& request) {
  return request.automatic ? request.auto_lossy.has_value() : IsLossyCodec(request.codec);
}

}  // namespace strait::localproto
