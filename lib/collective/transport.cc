// Transport's defaults: peer naming, and an abort that does nothing.
#include "collective/transport.h"

namespace strait::collective {

std::string Transport::PeerName(int peer) const {
  return "rank " + std::to_string(peer);
}

void Transport::Abort(uint64_t /*op_id*/, const Status& /*why*/, const std::string& /*note*/) {}

}  // namespace strait::collective
