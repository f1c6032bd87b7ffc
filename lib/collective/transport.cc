// Transport's default peer naming.
#include "collective/transport.h"

namespace strait::collective {

std::string Transport::PeerName(int peer) const {
  return "rank " + std::to_string(peer);
}

}  // namespace strait::collective
