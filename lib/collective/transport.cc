// Transport's defaults: peer naming, arrival stamps taken at the receive, and an abort that
// does nothing.
#include "collective/transport.h"

namespace strait::collective {

std::string Transport::PeerName(int peer) const {
  return "rank " + std::to_string(peer);
}

Status Transport::RecvStamped(int peer, uint64_t tag, Deadline deadline,
                               std::vector<uint8_t>* out, int64_t* arrived_ns) {
  Status s = Recv(peer, tag, deadline, out);
  if (arrived_ns != nullptr) *arrived_ns = MonotonicNanos();
  return s;
}

void Transport::Abort(uint64_t /*op_id*/, const Status& /*why*/, const std::string& /*note*/) {}

}  // namespace strait::collective
