// libFuzzer target for the compression-policy grammar (lib/localproto/policy_grammar.h), which
// parses text from the environment of every rank (STRAIT_COMPRESSION) and from every
// register-job request: arbitrary bytes are parsed as a policy. Besides "no crash, no
// out-of-bounds read" it checks that an accepted policy's canonical text parses back to the same
// request, fits kMaxCanonicalPolicyBytes (the CollNet handle's room), and is its own canonical
// text (what the CollNet handle compares across node heads).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "localproto/policy_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto request = strait::localproto::ParsePolicyRequest(text);
  if (!request.ok()) {
    if (request.status().code() != strait::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  const std::string canonical = strait::localproto::FormatPolicyRequest(*request);
  if (canonical.size() > strait::localproto::kMaxCanonicalPolicyBytes) std::abort();
  auto again = strait::localproto::ParsePolicyRequest(canonical);
  if (!again.ok() || !(*again == *request)) std::abort();
  if (strait::localproto::FormatPolicyRequest(*again) != canonical) std::abort();
  return 0;
}
