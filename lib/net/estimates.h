// Plain snapshots of what a link and an endpoint have measured and counted, for callers
// (metrics, codec choice, strait-bench). Copies: reading one never blocks the link.
#ifndef STRAIT_LIB_NET_ESTIMATES_H_
#define STRAIT_LIB_NET_ESTIMATES_H_

#include <cstdint>

namespace strait::net {

struct LinkEstimates {
  // Acknowledged payload bytes per second: per-chunk delivery-rate samples (bytes delivered over
  // the longer of the chunk's cut and ack intervals, so bunched acks cannot inflate one), averaged
  // per 250 ms window in which the link had data to send and smoothed by an EWMA with a 0.7 s
  // time constant (an idle link keeps its last estimate instead of decaying to zero).
  // 0 = not measured.
  double goodput_bytes_per_s = 0;
  // The highest rate of those windows (before smoothing) among the last 40 of them, 10 s of
  // busy link: what the link carried when it was kept busy, the better estimate of its capacity
  // where traffic comes in bursts (an all-reduce's phases) and windows are only partly used.
  // Keeps its value while the link idles; follows a link that got slower within 10 s of busy
  // windows. 0 = not measured.
  double peak_goodput_bytes_per_s = 0;
  // Round-trip time from ping/pong records, which queue behind data in the stream (so this is
  // the RTT a chunk sees, not the path's: see PathRttNs in adapt.h). 0 = not measured yet.
  int64_t rtt_min_ns = 0;
  int64_t rtt_smoothed_ns = 0;
  // The kernel's smoothed RTT (TCP_INFO tcpi_rtt) averaged over the streams up; 0 if unknown.
  int64_t tcp_rtt_ns = 0;
  // The kernel's minimum RTT (TCP_INFO tcpi_min_rtt), the least over every stream this link had:
  // the path's propagation delay, free of the queue the link builds. 0 if unknown.
  int64_t tcp_min_rtt_ns = 0;
  // TCP retransmissions (TCP_INFO tcpi_total_retrans) summed over every stream this link ever
  // had, including closed ones.
  uint64_t tcp_retransmissions = 0;
  // The pacing cap each stream has in the kernel (TCP_INFO tcpi_max_pacing_rate, bytes per
  // second), summed over the streams up: LinkOptions::max_rate_bps / 8 when pacing; 0 = none.
  uint64_t max_pacing_bytes_per_s = 0;
  int streams_up = 0;
  int streams_target = 0;       // K: the pool size the link is aiming for (dialer side)
  uint32_t chunk_bytes = 0;     // the chunk size currently cut
  uint64_t bytes_sent = 0;      // payload bytes written, resends included
  uint64_t bytes_acked = 0;     // payload bytes the peer acknowledged
  uint64_t bytes_received = 0;  // payload bytes read, duplicates included
  uint64_t chunks_sent = 0;
  uint64_t chunks_resent = 0;   // chunks written again after their stream died
  uint64_t duplicate_chunks = 0;  // received chunks dropped as duplicates
  uint64_t messages_sent = 0;     // sends completed OK
  uint64_t messages_delivered = 0;
  uint64_t send_failures = 0;     // sends completed with an error
  uint64_t stream_failures = 0;   // streams that died (any cause) or could not be dialled
  uint64_t protocol_errors = 0;   // streams closed because the peer broke the protocol
  uint64_t queued_bytes = 0;      // bytes waiting to be cut into chunks
  bool unreachable = false;       // the link gave up: no stream came up within the deadline
  bool ended = false;             // failed or closed (by either side): sends fail; a caller
                                  // that still needs the peer opens a new link
};

// Counters of the endpoint's listener and dialer: peers refused, by reason. Every refusal also
// logs one warning line naming the peer address and the reason.
struct EndpointCounters {
  uint64_t streams_accepted = 0;
  uint64_t tls_handshake_failures = 0;  // includes certificates from another CA, garbage on TLS
  uint64_t bad_magic = 0;               // not a Strait hello (garbage bytes, TLS mismatch)
  uint64_t bad_version = 0;             // a hello with another wire version
  uint64_t bad_hello = 0;               // malformed hello fields
  uint64_t unknown_region = 0;          // certificate names a region not in the config, or a
                                        // plain in-region stream comes from an unlisted address
  uint64_t identity_mismatch = 0;       // hello region differs from the certificate's region
                                        // (in-region listener: from this endpoint's region), or
                                        // a stream's transport differs from its link's
  uint64_t handshake_timeouts = 0;      // TCP/TLS/hello not completed within the deadline
  uint64_t setup_overflows = 0;         // closed while setting up for a newer connection (more
                                        // than EndpointOptions::max_pending_streams at once)
  uint64_t links_accepted = 0;
  uint64_t unknown_sessions = 0;        // redials of a link this process does not know (it, or
                                        // the dialer's peer, restarted): answered and closed
};

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_ESTIMATES_H_
