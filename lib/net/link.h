// WAN links between region gateways: the public face of strait::net.
//
// An Endpoint is one gateway's WAN side: its identity (region, TLS certificate), the I/O thread
// the library owns, a listener for peers, and the links. A Link to a peer gateway is a pool of K
// TCP streams (TLS 1.3 with mutual authentication unless plain TCP is configured on both sides).
// Messages sent on a link are cut into chunks that go to whichever stream can take one now; the
// peer acknowledges chunks; when a stream dies its unacknowledged chunks go out on the others and
// the dialing side redials it with exponential backoff. Each message reaches the peer's receive
// callback exactly once, whole, and in order per channel. By default the link adapts K (more
// streams while they raise goodput, as under per-flow caps or loss; fewer while that costs
// nothing) and the chunk size (bandwidth x RTT); see LinkOptions.
//
// Usage:
//   EndpointOptions options;  options.region = "us-east";  (+ CA, certificate, key, peers)
//   auto endpoint = Endpoint::Create(options, [](std::shared_ptr<Link> link) {
//     return MessageCallback([](uint32_t channel, std::vector<uint8_t> message) { ... });
//   });
//   auto port = (*endpoint)->Listen("127.0.0.1", 0);
//   auto link = (*endpoint)->Connect("eu-west", "10.0.0.7", 7400, on_message);
//   (*link)->Send(channel, std::move(bytes), Deadline::AfterSeconds(30),
//                 [](Status status) { ... });
//
// Threads and ownership: every callback (receive, send completion, accept) runs on the
// endpoint's I/O thread; it must not block, and must not destroy the Endpoint. Public methods
// are thread-safe and never block on the network unless their comment says so. Links are shared
// handles: the caller's copy and the endpoint's bookkeeping both keep one. A Link may outlive its
// Endpoint; it then fails every call with kUnavailable.
//
// Failure: every wait has a deadline. A send completes with OK once the peer acknowledged every
// chunk, or with kDeadlineExceeded (its deadline passed), kUnavailable (the link failed: peer
// unreachable past `unreachable_after_ns`, or closed by the peer), or kCancelled (closed here).
// Bad peers (garbage, wrong version, a certificate from another CA, an unknown region) are
// refused with one warning line and a counter (EndpointCounters) and do not affect other links.
#ifndef STRAIT_LIB_NET_LINK_H_
#define STRAIT_LIB_NET_LINK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "net/delivery.h"
#include "net/estimates.h"
#include "strait/status.h"

namespace strait::net {

enum class Transport : uint8_t {
  kTls = 0,       // TLS 1.3, mutual authentication against the cluster CA (the default)
  kPlainTcp = 1,  // no encryption and no authentication: only for trusted test networks
};

// Adaptation is on by default (since the per-flow-cap WAN test showed it converging). A round is
// max(1 s, 10 RTT) of busy link, measured after new streams had max(1.5 s, 4 RTT) to leave slow
// start; its goodput is the data cut during the round that the peer acknowledged (read two RTTs
// after it). K starts at `streams` and doubles while the doubling raised the mean goodput of its
// two (or three) rounds by at least 10% (per-flow caps and loss-bound cubic need tens of
// streams), quadrupling after a near-linear gain (4 -> 8 -> 32 -> 64); a doubling that gained
// 5-10%, or (once, right after one that paid) that neither gained nor lost, is kept; any other
// goes back, never below the start. Then K holds for 20 rounds and probes upwards again; it
// stays within [min_streams, max_streams]. Streams taken out are retired (drained, no
// resends). The chunk size follows a quarter of one stream's share of bandwidth x path RTT (the
// kernel's minimum RTT). Set adapt_streams / adapt_chunk to false for a fixed K or chunk size.
// See StreamCountController.
struct LinkOptions {
  // K, the number of streams a dialed link opens (1..64). With adapt_streams it is the start,
  // and must lie within [min_streams, max_streams].
  int streams = 4;
  bool adapt_streams = true;  // adapt K on goodput within [min_streams, max_streams]
  int min_streams = 1;
  int max_streams = 64;
  // Chunk size cut from messages; with adapt_chunk it is the start, then follows bandwidth x RTT
  // within [min_chunk_bytes, max_chunk_bytes]. At most 16 MiB.
  uint32_t chunk_bytes = 256 * 1024;
  bool adapt_chunk = true;
  uint32_t min_chunk_bytes = 64 * 1024;
  uint32_t max_chunk_bytes = 4 * 1024 * 1024;
  // Unacknowledged bytes one stream may carry; bounds what a stream's death costs to resend.
  uint64_t max_inflight_per_stream = 8 * 1024 * 1024;
  // The largest message the receiving side accepts (it allocates a message's size up front).
  uint64_t max_message_bytes = uint64_t{1} << 30;
  // Bytes the receiving side holds at most for messages being assembled (or complete and waiting
  // for an earlier message of their channel), at least max_message_bytes. A peer that sends
  // beyond it breaks the protocol (its stream is closed and counted in protocol_errors). Set it
  // alike on both sides: the sender holds new messages back to stay within it.
  uint64_t max_partial_bytes = uint64_t{2} << 30;
  // Bytes a link may hold queued and not yet cut; Send beyond it fails with kResourceExhausted.
  uint64_t max_queued_bytes = uint64_t{4} << 30;
  // Link::Close() keeps sending what was queued before it for at most this long (each send also
  // keeps its own deadline), then tells the peer and cancels what is left.
  int64_t close_flush_ns = int64_t{5'000'000'000};
  // TCP_CONGESTION for every stream ("bbr", "cubic", "reno"; "" = the system default).
  std::string congestion_control;
  // Pacing: the most bits per second this link sends toward its peer, all its streams together
  // (each gets SO_MAX_PACING_RATE of an equal share, redone whenever a stream comes or goes).
  // 0 = no cap: TCP's congestion control alone, which on a WAN path with shallow buffers and
  // several flows (two gateways of a region, or several streams) overshoots and drops: BBR
  // probes above its share, and the flows' estimates together exceed the path. Set it to this
  // gateway's share of the path's rate (the circuit's rate / the gateways that share it).
  uint64_t max_rate_bps = 0;
  // max_rate_bps for the links to particular peer regions (key: the region name). Links to
  // gateways of the endpoint's own region (region all-reduces, on the LAN) are paced only when
  // their region is listed here: max_rate_bps is about the WAN path.
  std::map<std::string, uint64_t> peer_max_rate_bps;
  // TCP_NOTSENT_LOWAT for every stream; 0 = leave unset.
  uint32_t notsent_lowat = 128 * 1024;
  // Deadline for TCP connect + TLS handshake + hello exchange of one stream.
  int64_t handshake_timeout_ns = int64_t{5'000'000'000};
  // Redial backoff: initial * 2^attempt, at most max, times a random factor in [0.5, 1].
  int64_t redial_initial_ns = 50'000'000;
  int64_t redial_max_ns = 2'000'000'000;
  // A link with no stream up for this long fails: pending sends get kUnavailable.
  int64_t unreachable_after_ns = int64_t{30'000'000'000};
  // Each stream pings at this interval (RTT estimate, liveness) and is declared dead when
  // nothing at all arrived on it for stream_timeout_ns.
  int64_t ping_interval_ns = 200'000'000;
  int64_t stream_timeout_ns = int64_t{10'000'000'000};
  // The longest a stream's TCP retransmission timer backs off to (TCP_RTO_MAX_MS, Linux 6.15+;
  // an older kernel keeps its 120 s and this is ignored): during an outage TCP doubles the timer
  // at each retransmission, so a stream resumed only at the next one after the path came back --
  // a 3 s outage cost up to 7.3 s. Capped, it resumes within this of the path's return.
  // 0 = the kernel's; else 1 s .. 120 s (the kernel's bounds).
  int64_t tcp_rto_max_ns = 1'000'000'000;
};

struct EndpointOptions {
  std::string region;  // this gateway's region; with TLS it must match its certificate
  Transport transport = Transport::kTls;
  std::string ca_file;    // PEM: the cluster CA every peer chains to
  std::string cert_file;  // PEM chain naming strait://region/<region> in a SAN URI
  std::string key_file;   // PEM private key
  // Regions whose gateways may connect to this endpoint's listener (and be dialed).
  std::vector<std::string> peer_regions;
  LinkOptions link;
  // Accepted streams still setting up (TCP accepted; TLS handshake or hello not done) at most at
  // once. A connection beyond it closes the oldest one still setting up, so that a flood of
  // silent or foreign connections costs bounded memory (~100 KiB of TLS buffers each) and
  // descriptors, and a peer's fresh stream still gets in (the oldest is the one least likely to
  // finish). 0 = the larger of 256 and twice peer_regions x link.max_streams (every peer
  // redialling every stream at once still fits). Either way at most half the process's
  // descriptor limit (RLIMIT_NOFILE), so that links, local clients and the HTTP port keep
  // descriptors while the WAN port is flooded.
  size_t max_pending_streams = 0;
};

// Which option a failed CheckEndpoint is about, so that a caller can name its own config key.
enum class EndpointSetting : int {
  kNone = 0,
  kOptions = 1,            // region names, link limits and timeouts
  kCongestionControl = 2,  // link.congestion_control is not offered by this kernel
  kCaFile = 3,             // ca_file missing, unreadable or not PEM
  kCertFile = 4,           // cert_file missing, unreadable or not PEM
  kCertRegion = 5,         // cert_file names another region than `region`, or none, or several
  kKeyFile = 6,            // key_file missing, unreadable or not PEM
  kKeyMismatch = 7,        // key_file is not the key of cert_file
};

// Everything Endpoint::Create checks -- the options, the kernel's congestion control, the TLS
// identity (files, key/certificate pair, region) -- without starting anything, so that a config
// check (`straitd --check-config`) fails where a start would. On error `*setting` (if not null)
// names the option at fault. Thread-safe; reads files, does not touch the network.
Status CheckEndpoint(const EndpointOptions& options, EndpointSetting* setting);

// Receives one whole message. Runs on the I/O thread; must not block.
using MessageCallback = std::function<void(uint32_t channel, std::vector<uint8_t> message)>;

class Link {
 public:
  struct Impl;
  explicit Link(std::unique_ptr<Impl> impl);
  // Releases this handle only; the link stays up until Close() or its endpoint shuts down.
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  const std::string& peer_region() const;

  // Queues `message` on `channel`; takes ownership of the bytes. `done` runs exactly once, on
  // the I/O thread, with OK when the peer acknowledged every chunk or an error naming the peer
  // (see the file comment); if the endpoint is already gone it runs at once on this thread.
  // Thread-safe; never blocks.
  void Send(uint32_t channel, std::vector<uint8_t> message, Deadline deadline, SendDone done);

  // Blocking helper: Send and wait for its completion (at most until the deadline plus a
  // moment). Must not be called from an I/O-thread callback (returns kFailedPrecondition).
  Status SendAndWait(uint32_t channel, std::vector<uint8_t> message, Deadline deadline);

  // Blocking helper: waits until at least `streams` streams are up. kDeadlineExceeded if not by
  // the deadline, kUnavailable if the link failed. Must not be called from the I/O thread.
  Status WaitForStreams(int streams, Deadline deadline);

  // A copy of the link's measurements and counters. Thread-safe; never blocks on the network.
  LinkEstimates Estimates() const;

  // Stops taking sends (later ones fail with kCancelled), keeps sending what was queued before
  // for at most LinkOptions::close_flush_ns (each send's own deadline still applies), then tells
  // the peer, closes every stream and fails what is left with kCancelled. The peer's link fails
  // its unfinished sends with kUnavailable and does not redial. Thread-safe; does not block;
  // idempotent.
  void Close();

  // Test hook: shuts down the socket of stream `index` as if the network dropped it, without
  // telling the peer. Thread-safe; does not block.
  void KillStreamForTest(int index);

  // Test hook: resizes the pool of a dialed link to `streams` (clamped to [1, max_streams]) as
  // adaptation would: new slots are dialled, streams above the size are retired (drained without
  // resends). Adaptation, when on, may change it again later. Thread-safe; does not block.
  void SetStreamsForTest(int streams);

  // A handle to the same link whose sends go out on `channel + base` (base added to this
  // handle's own): what lets several users share one link, each on its own block of channels
  // (straitd's shards; collective/channels.h, kShardChannelStride). Everything else -- streams,
  // estimates, Close -- is the one link's. The receiving side sees the offset channels and
  // subtracts the base itself. Thread-safe; does not block.
  std::shared_ptr<Link> WithChannelBase(uint32_t base) const;
  // The base this handle adds to every channel it sends on (0 for the link itself).
  uint32_t channel_base() const { return channel_base_; }

 private:
  std::unique_ptr<Impl> impl_;
  uint32_t channel_base_ = 0;
};

// Called on the I/O thread for each link a peer opens to this endpoint, before any of its
// messages; returns the callback that receives them.
using AcceptCallback = std::function<MessageCallback(std::shared_ptr<Link> link)>;

class Endpoint {
 public:
  // Checks the options (region names, congestion control, limits), loads the TLS identity and
  // starts the I/O thread. Errors name the option or file at fault. Does not touch the network.
  static StatusOr<std::unique_ptr<Endpoint>> Create(EndpointOptions options,
                                                    AcceptCallback on_accept);
  // Closes the listener and every link (unfinished sends fail with kUnavailable; nothing is
  // flushed), tells every peer so that it does not redial, and joins the I/O thread. Blocks
  // briefly (at most about half a second while close records go out); must not be called from
  // an I/O-thread callback.
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Listens on `address` (numeric IPv4/IPv6) and `port` (0 = ephemeral); returns the port.
  // Thread-safe; does not block. At most one listener per endpoint.
  StatusOr<uint16_t> Listen(const std::string& address, uint16_t port);

  // Opens a link to the gateway of `peer_region` at address:port (numeric). Returns at once; the
  // streams come up in the background and sends queue meanwhile. `on_message` receives the
  // peer's messages on this link. Thread-safe; does not block.
  StatusOr<std::shared_ptr<Link>> Connect(const std::string& peer_region,
                                          const std::string& address, uint16_t port,
                                          MessageCallback on_message);

  // Plain TCP inside the region (straitd's `[region_links] transport = "plain"`): a region's own
  // gateways exchange 2x each tensor of a region all-reduce over their LAN, and TLS on that hop
  // costs CPU the WAN hop needs, where NCCL's own traffic inside the datacenter is plain as well.
  // ListenInRegion opens a second listener, without TLS, that admits only streams from one of
  // `region_hosts` (numeric IPs: the region's other gateways) whose hello names this endpoint's
  // own region; it must be bound to the LAN, as nothing on it is encrypted or authenticated
  // beyond the source address (and a link's streams all come from one). The endpoint's own
  // region must be among its peer_regions (else kFailedPrecondition). At most one.
  // ConnectInRegion dials such a listener of a gateway of this endpoint's own region. A stream
  // from one listener never joins a link set up over the other. Thread-safe; neither blocks.
  StatusOr<uint16_t> ListenInRegion(const std::string& address, uint16_t port,
                                    const std::vector<std::string>& region_hosts);
  StatusOr<std::shared_ptr<Link>> ConnectInRegion(const std::string& address, uint16_t port,
                                                  MessageCallback on_message);

  // A copy of the listener's and dialer's refusal counters. Thread-safe.
  EndpointCounters Counters() const;

  // Certificate rotation: re-reads the CA, certificate and key files named in the options into
  // a new TLS context that every later handshake (dialed or accepted) uses; streams already up
  // keep the identity they were set up with, so no link drops. On any error (unreadable file,
  // key not matching, certificate naming another region) the old identity stays in use and the
  // error names the file. kFailedPrecondition with plain TCP. Thread-safe; blocks only on
  // reading the files (straitd calls it on SIGHUP).
  Status ReloadIdentity();

  const EndpointOptions& options() const;

  struct Impl;

 private:
  explicit Endpoint(std::unique_ptr<Impl> impl);
  // Connect and ConnectInRegion: `in_region` dials plain TCP whatever the endpoint's transport.
  StatusOr<std::shared_ptr<Link>> Dial(const std::string& peer_region, const std::string& address,
                                       uint16_t port, MessageCallback on_message, bool in_region);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_LINK_H_
