// Helpers shared by the files that implement policy.h (policy.cc, codec_choice.cc,
// policy_agreement.cc); not for other files. Kept here so that each rule has one definition.
#ifndef STRAIT_LIB_GATEWAY_POLICY_INTERNAL_H_
#define STRAIT_LIB_GATEWAY_POLICY_INTERNAL_H_

#include <algorithm>
#include <vector>

#include "strait/types.h"

namespace strait::gateway::policy_internal {

// Whether `codec` is among `codecs` (an allowed-codecs list).
inline bool Allowed(const std::vector<CodecId>& codecs, CodecId codec) {
  return std::find(codecs.begin(), codecs.end(), codec) != codecs.end();
}

}  // namespace strait::gateway::policy_internal

#endif  // STRAIT_LIB_GATEWAY_POLICY_INTERNAL_H_
