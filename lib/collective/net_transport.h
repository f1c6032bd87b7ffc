// A Transport over strait::net links: how gateways run the collective across regions.
//
// Each rank is a gateway; rank i talks to rank j over one net::Link (a TLS stream pool), using
// one link channel reserved for collective traffic. A message is the tag and a small header
// before the payload:
//   off size field (little-endian)
//     0    1 version (kNetTransportVersion = 1)
//     1    1 kind (0 = data)
//     2    2 reserved, zero
//     4    4 the sender's rank
//     8    8 tag
//    16    . payload
// A message with another version or kind, a wrong sender rank or a short header is a protocol
// error: that peer is marked failed (kDataLoss), so the waits on it end at once with the reason.
// Messages to this rank itself never touch the network.
//
// Usage:
//   NetTransport transport(my_rank, world, names);
//   // on every link to peer p (dialed or accepted), deliver its messages with:
//   endpoint->Connect(region_of[p], host, port, transport.ReceiverFor(p));   // dialed
//   return transport.ReceiverFor(p);                                        // in AcceptCallback
//   transport.SetLink(p, link);
//   AllReduce(transport, request);
//
// A send completes when the peer acknowledged it; a link that fails (kUnavailable: peer
// unreachable or closed) also fails that peer in the mailbox, so receives from it end at once.
// Thread-safe. Receivers hold the mailbox by shared pointer and may outlive the transport.
#ifndef STRAIT_LIB_COLLECTIVE_NET_TRANSPORT_H_
#define STRAIT_LIB_COLLECTIVE_NET_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collective/mailbox.h"
#include "collective/transport.h"

namespace strait::net {
class Link;
}  // namespace strait::net

namespace strait::collective {

inline constexpr uint8_t kNetTransportVersion = 1;
inline constexpr size_t kNetTransportHeaderSize = 16;
// The link channel collective messages use unless told otherwise.
inline constexpr uint32_t kDefaultCollectiveChannel = 16;

class NetTransport final : public Transport {
 public:
  // Same signature as net::MessageCallback.
  using Receiver = std::function<void(uint32_t channel, std::vector<uint8_t> message)>;

  // `names[i]` (optional) names rank i in errors, e.g. its region.
  NetTransport(int rank, int size, std::vector<std::string> names = {},
               uint32_t channel = kDefaultCollectiveChannel);
  ~NetTransport() override;

  // The message callback for the link to `peer`. Messages on other channels go to `other`
  // (dropped when it is empty). Thread-safe; may be called before SetLink.
  Receiver ReceiverFor(int peer, Receiver other = nullptr);
  // The link that carries messages to `peer`; replaces an earlier one and clears the peer's
  // failure. Thread-safe.
  void SetLink(int peer, std::shared_ptr<net::Link> link);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string PeerName(int peer) const override;
  void Send(int peer, uint64_t tag, std::vector<uint8_t> bytes, Deadline deadline,
            SendDone done) override;
  Status Recv(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out) override;

  // Messages received and not yet taken (for tests and metrics).
  size_t BufferedMessages() const { return mailbox_->BufferedMessages(); }

 private:
  const int rank_;
  const int size_;
  const std::vector<std::string> names_;
  const uint32_t channel_;
  std::shared_ptr<Mailbox> mailbox_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<net::Link>> links_;
};

}  // namespace strait::collective

#endif  // STRAIT_LIB_COLLECTIVE_NET_TRANSPORT_H_
