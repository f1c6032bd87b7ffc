// `strait-bench link`: what a WAN link between two gateways delivers through strait::net, like
// iperf3 but with Strait's own multi-stream links. One side serves (`--serve`), the other drives
// every measurement (`--connect HOST:PORT`):
//   - goodput (payload bytes the peer acknowledged per second, over a steady window after a
//     warm-up), RTT and TCP retransmissions for each stream count (1, 2, 4, 8, 16) and for the
//     adaptive mode (lib/net's hill climbing on K and chunk size);
//   - each codec's speed and ratio on gradient-like data, measured here, and its effective
//     throughput on this link = input bytes / max(encode time, wire time, decode time);
//   - a recommended configuration: streams, chunk size, codec (net::ChooseCodec), congestion
//     control.
//
// Protocol: the client opens one control link (one stream) and, for each measurement, a fresh
// data link (its own Endpoint, since the stream count is an endpoint option). Data goes on
// channel kDataChannel and the server discards it once whole; the control link carries short
// text messages on kControlChannel ("test <label>", "done") so that the server can log what is
// measured and, with --one-off, exit when the client is done. The server needs no per-test
// flags.
#ifndef STRAIT_BENCH_LINK_BENCH_H_
#define STRAIT_BENCH_LINK_BENCH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "bench/codec_bench.h"
#include "net/link.h"
#include "strait/status.h"
#include "tools/cli/cli_fwd.h"

namespace strait::bench {

inline constexpr uint32_t kLinkBenchDataChannel = 0;
inline constexpr uint32_t kLinkBenchControlChannel = 1;
inline constexpr uint16_t kLinkBenchDefaultPort = 7411;
inline constexpr const char* kLinkBenchDefaultStreams = "1,2,4,8,16,adaptive";
inline constexpr const char* kLinkBenchDefaultCodecs = "none,zstd,int8";

// One measurement: a fixed stream count, or adaptive (0).
struct StreamSpec {
  int streams = 0;  // 0 = adaptive
  bool adaptive() const { return streams == 0; }
  std::string Label() const;  // "4" or "adaptive"
};

struct LinkBenchOptions {
  // Endpoint identity and transport: region, peer_regions, transport, CA/cert/key.
  net::EndpointOptions endpoint;
  std::string host;  // --connect: numeric address of the server
  uint16_t port = kLinkBenchDefaultPort;
  std::vector<StreamSpec> streams;
  int64_t duration_ns = 5'000'000'000;  // measured window per test
  int64_t warmup_ns = -1;               // before the window; -1 = clamp(duration / 2, 0.1 s, 2 s)
  std::string congestion_control;       // "" = the system default
  // 0 = adapt the chunk size to the bandwidth-delay product (lib/net's adapt_chunk).
  uint32_t chunk_bytes = 0;
  int max_streams = 64;                       // adaptive mode's ceiling
  uint64_t message_bytes = uint64_t{4} << 20;  // size of each Send
  uint64_t inflight_bytes = uint64_t{64} << 20;  // bytes kept submitted and unacknowledged
  uint64_t max_inflight_per_stream = 0;          // 0 = lib/net's default
  int64_t notsent_lowat = -1;                    // -1 = lib/net's default
  std::optional<double> link_rate_bps;           // the bound, when the user knows it
  std::vector<CodecRowSpec> codecs;
  uint64_t codec_bytes = uint64_t{16} << 20;  // gradient bytes per codec measurement
  int codec_iters = 3;
};

struct StreamResult {
  StreamSpec spec;
  int streams_end = 0;  // K at the end of the window (adaptive: where it settled)
  uint32_t chunk_bytes = 0;
  double seconds = 0;           // measured window
  uint64_t bytes_acked = 0;     // in the window
  double goodput_bps = 0;       // bits per second of acknowledged payload
  int64_t rtt_min_ns = 0;       // from lib/net's pings (queued behind data)
  int64_t rtt_smoothed_ns = 0;
  int64_t tcp_rtt_ns = 0;       // the kernel's smoothed RTT, averaged over streams
  uint64_t retransmissions = 0;  // TCP segments retransmitted in the window
  uint64_t stream_failures = 0;
  double cpu_fraction = 0;       // this process's CPU time / window (1 = one core busy)
  net::LinkEstimates estimates;  // at the end of the window
};

struct CodecLinkResult {
  std::string codec;  // row spec, e.g. "int8+zstd"
  bool lossless = false;
  double ratio = 1;
  double encode_bytes_per_s = 0;  // single thread, input bytes
  double decode_bytes_per_s = 0;
  // Input bytes per second through encode, the link at the measured goodput, and decode.
  double effective_bps = 0;
  std::string bottleneck;  // "encode", "link" or "decode"
};

struct Recommendation {
  std::string streams;  // "8" or "adaptive"
  uint32_t chunk_bytes = 0;
  std::string codec;
  std::string congestion_control;
  double goodput_bps = 0;    // what the recommended stream setting measured
  double effective_bps = 0;  // with the recommended codec, in input bytes
};

struct LinkBenchReport {
  LinkBenchOptions options;
  std::string transport;  // "tls" or "plain"
  std::string congestion_control;
  std::string date;
  std::string cpu;
  int64_t warmup_ns = 0;
  std::vector<StreamResult> tests;
  std::vector<CodecLinkResult> codecs;
  Recommendation recommended;
};

// Parses "1,2,4,adaptive"; the error names the bad item.
StatusOr<std::vector<StreamSpec>> ParseStreamList(std::string_view text, int max_streams);
// Splits "HOST:PORT" or "[V6]:PORT"; the error says what is expected.
StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view text);

// Runs the client side against a server. `progress` may be null.
StatusOr<LinkBenchReport> RunLinkBench(const LinkBenchOptions& options, ProgressLine* progress);
// Serves until SIGINT/SIGTERM, or (one_off) until one client said it is done.
// Prints "listening on ADDR:PORT" on stdout once ready.
Status RunLinkServer(const net::EndpointOptions& options, const std::string& address,
                     uint16_t port, bool one_off);

std::string FormatLinkReportTable(const LinkBenchReport& report);
std::string FormatLinkReportJson(const LinkBenchReport& report);

// Registers `strait-bench link`'s flags on `cmd`.
CommandMain SetupLinkCommand(CLI::App& cmd);

}  // namespace strait::bench

#endif  // STRAIT_BENCH_LINK_BENCH_H_
