// A Transport over strait::net links: how gateways run the collective across regions.
//
// Each rank is a gateway; rank i talks to rank j over one net::Link (a TLS stream pool), using
// link channels reserved for collective traffic. A message is a payload and a 24-byte trailer:
//   off (from the trailer's start) size field (little-endian)
//     0    1 version (kNetTransportVersion = 4)
//     1    1 kind: 0 = data, 1 = abort, 2 = hello (explicit values, never renumbered)
//     2    2 reserved, zero
//     4    4 the sender's rank
//     8    8 data: the tag; abort: the op id; hello: zero
//    16    8 the sender's incarnation (random, nonzero, new each time the process starts)
// before it: data: the payload; abort: u32 reason length, the reason (UTF-8), then the note (the
// rest); hello: nothing (a hello is the trailer alone).
// The framing sits behind the payload so that neither side moves the payload: the sender appends
// it within the spare capacity the producer left (kSendHeadroom), the receiver cuts it off by
// shrinking the message. (In front, as in version 3, it cost a pass over every payload on each
// side: 4-5% of straitd's CPU in the CollNet bench of 2026-12-07, bench/README.md.)
// A message with another version, a wrong sender rank, a zero incarnation or a short trailer is a
// protocol error: that peer is marked failed (kDataLoss), so the waits on it end at once with the
// reason. A kind this build does not know is dropped with a warning (so that later versions may
// add kinds without breaking this one). Messages to this rank itself never touch the network.
//
// Wire versions: version 1 (the first straitd slice, never released) had a 16-byte header
// without the incarnation and only kind 0. Version 3 had version 2's layout; it changed what op
// ids mean (the gateway's operation identities, gateway/generation.h, replaced its numbering),
// so gateways of versions 2 and 3 refuse each other instead of never pairing. Version 4 moved the
// same 24 bytes from the front to the back. Versions 3 and 4 refuse each other on the hello each
// side sends on every new link (a hello is 24 bytes, the same bytes in either version, so each
// reads the other's version number and names both); upgrade every gateway of a shard together.
//
// Aborts (kind 1): Abort(op, why, note) sends one to every peer with a link. The receiver's
// mailbox forgets that op (its buffered and late messages are dropped, see Mailbox) and its
// receives fail with kAborted "rank N (region) aborted the operation: <why>"; then the abort
// listener (SetAbortListener) gets the note (the gateway resets that job's numbering with it).
//
// Incarnations and restarts: every message carries its sender's incarnation. SetLink sends a
// hello on the new link, so that the peer learns this incarnation even before any operation.
// When a message from peer p carries an incarnation other than the one known for p, p restarted:
// everything buffered from its old incarnation is dropped, p's failure is cleared, and messages
// still arriving from an old incarnation are dropped. PeerIncarnation(p) is p's incarnation as
// last heard on its current link (0 until something arrived on it), which the gateway uses to
// number operations per set of live processes.
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
// unreachable or closed) also fails that peer in the mailbox, so receives from it end at once,
// unless that link was replaced by a newer one meanwhile (the old link of a restarted peer
// fails long after its new link came up). Thread-safe. Receivers hold the shared state by shared
// pointer and may outlive the transport.
#ifndef STRAIT_LIB_COLLECTIVE_NET_TRANSPORT_H_
#define STRAIT_LIB_COLLECTIVE_NET_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collective/channels.h"
#include "collective/mailbox.h"
#include "collective/transport.h"

namespace strait::net {
class Link;
}  // namespace strait::net

namespace strait::collective {

inline constexpr uint8_t kNetTransportVersion = 4;
inline constexpr size_t kNetTransportTrailerSize = 24;
static_assert(kSendHeadroom >= kNetTransportTrailerSize, "senders leave room for the trailer");
enum class NetMessageKind : uint8_t {
  kData = 0,
  kAbort = 1,
  kHello = 2,
};
// The sender rank a framed message's trailer names, unchecked (the receiver for that rank checks
// the rest); -1 for a message shorter than the trailer. For a region's accepted links, whose
// messages go to the receiver of the rank they name.
int NetMessageSender(const std::vector<uint8_t>& message);
// Abort reasons and notes longer than these are cut.
inline constexpr size_t kMaxAbortReasonBytes = 1024;
inline constexpr size_t kMaxAbortNoteBytes = 4096;
// The link channels collective messages use unless told otherwise (kDefaultCollectiveChannel,
// kCollectiveChannelCount) are in channels.h's map, with every other link user's.

class NetTransport final : public Transport {
 public:
  // Same signature as net::MessageCallback.
  using Receiver = std::function<void(uint32_t channel, std::vector<uint8_t> message)>;
  // Runs for each abort a peer sent, after the mailbox forgot the op: the peer, the op id (low
  // 38 bits) and the note it carried. Runs on a link's I/O thread; must not block.
  using AbortListener = std::function<void(int peer, uint64_t op_id, const std::string& note)>;

  // `names[i]` (optional) names rank i in errors, e.g. its region. Messages go out on link
  // channels [channel, channel + channels): a message's channel is channel + (its tag's op id
  // mod channels). The link cuts channels round-robin, so operations on different channels share
  // it fairly (the gateway puts a job's lane in its op ids: one channel per job). Any channel
  // keeps correctness, since messages are matched by tag.
  NetTransport(int rank, int size, std::vector<std::string> names = {},
               uint32_t channel = kDefaultCollectiveChannel, uint32_t channels = 1);
  ~NetTransport() override;

  // The message callback for the link to `peer`. Messages on other channels go to `other`
  // (dropped when it is empty). Thread-safe; may be called before SetLink.
  Receiver ReceiverFor(int peer, Receiver other = nullptr);
  // The link that carries messages to `peer`; replaces an earlier one, clears the peer's
  // failure and sends this incarnation's hello on it. Until a message arrives on a replacing
  // link, PeerIncarnation(peer) is 0. Thread-safe.
  void SetLink(int peer, std::shared_ptr<net::Link> link);
  // Replaces the abort listener (nullptr: none). Thread-safe.
  void SetAbortListener(AbortListener listener);

  // This process's incarnation (random, nonzero).
  uint64_t incarnation() const { return incarnation_; }
  // `peer`'s incarnation as heard on its current link; this rank's own for rank(); 0 while
  // unknown (nothing arrived yet on the current link). Thread-safe.
  uint64_t PeerIncarnation(int peer) const;
  // How many times a peer was seen to restart (a new incarnation). Thread-safe.
  uint64_t PeerRestarts() const;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string PeerName(int peer) const override;
  void Send(int peer, uint64_t tag, std::vector<uint8_t> bytes, Deadline deadline,
            SendDone done) override;
  Status Recv(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out) override;
  Status RecvStamped(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out,
                     int64_t* arrived_ns) override;
  void Abort(uint64_t op_id, const Status& why, const std::string& note = "") override;

  // Drops this rank's buffered messages of `op_id` and those that arrive later, telling no
  // peer: for an operation that ended here without taking all of them (the gateway's commit,
  // when a relay stood in for a peer's direct confirmation). Thread-safe; never blocks.
  void Forget(uint64_t op_id);

  // Messages received and not yet taken (for tests and metrics).
  size_t BufferedMessages() const;
  // The mailbox (for tests and metrics: dropped messages, forgotten ops).
  const Mailbox& mailbox() const;

 private:
  const int rank_;
  const int size_;
  const std::vector<std::string> names_;
  const uint32_t channel_;
  const uint32_t channels_;
  const uint64_t incarnation_;
  // What the receivers and send completions share with the transport (see the .cc).
  struct Shared;
  std::shared_ptr<Shared> shared_;

  // Frames and sends one message (any kind) to `peer` over `link`.
  void SendOn(const std::shared_ptr<net::Link>& link, int peer, NetMessageKind kind,
              uint64_t tag, const uint8_t* payload, size_t size, uint32_t lane,
              Deadline deadline, SendDone done);
  // Appends the trailer of a message of `kind` under `tag` to `message`.
  void AppendTrailer(NetMessageKind kind, uint64_t tag, std::vector<uint8_t>* message) const;
  // Sends a framed message (trailer behind) on the lane's channel; a dead link fails the peer.
  void SendMessage(const std::shared_ptr<net::Link>& link, int peer, std::vector<uint8_t> message,
                   uint32_t lane, Deadline deadline, SendDone done);
};

}  // namespace strait::collective

#endif  // STRAIT_LIB_COLLECTIVE_NET_TRANSPORT_H_
