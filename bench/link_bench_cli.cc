// `strait-bench link`'s command line: the flags, their checks and defaults, and what runs
// (the server, or the client and its report). Apart from the measurement (link_bench.cc) because
// it is the one part about the user's input rather than about links.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "bench/codec_bench.h"
#include "bench/link_bench.h"
#include "common/clock.h"
#include "common/units.h"
#include "net/socket_options.h"
#include "net/tls.h"
#include "tools/cli/cli.h"

namespace strait::bench {
namespace {

constexpr const char* kCommand = "link";
constexpr const char* kDefaultClientRegion = "bench-client";
constexpr const char* kDefaultServerRegion = "bench-server";

}  // namespace

CommandMain SetupLinkCommand(CLI::App& cmd) {
  struct Flags {
    bool serve = false;
    bool one_off = false;
    std::string connect;
    std::string listen = "0.0.0.0:" + std::to_string(kLinkBenchDefaultPort);
    bool plain = false;
    std::string ca, cert, key, region, peer_region;
    std::string duration = "5s";
    std::string warmup;
    std::string streams = kLinkBenchDefaultStreams;
    std::string cc;
    std::string codecs = kLinkBenchDefaultCodecs;
    std::string chunk = "auto";
    int max_streams = 64;
    uint64_t message = uint64_t{4} << 20;
    uint64_t inflight = uint64_t{64} << 20;
    uint64_t inflight_per_stream = 0;
    std::string notsent_lowat;
    std::string link_rate;
    uint64_t codec_size = uint64_t{16} << 20;
  };
  auto f = std::make_shared<Flags>();
  cmd.description(
      "Goodput of a strait::net link per stream count and adaptive, RTT, retransmissions, "
      "each codec's effective throughput on it, and a recommended configuration. Run "
      "`--serve` on one host and `--connect HOST:PORT` on the other (like iperf3).");
  auto* serve = cmd.add_flag("--serve", f->serve, "Serve: sink the client's data until stopped");
  auto* connect = cmd.add_option("--connect", f->connect, "Measure against a server")
                      ->type_name("HOST:PORT");
  serve->excludes(connect);
  cmd.add_flag("--one-off", f->one_off, "Serve one client run, then exit")->needs(serve);
  cmd.add_option("--listen", f->listen, "Server address (numeric) and port; port 0 = any")
      ->type_name("ADDR:PORT")
      ->default_str(f->listen)
      ->needs(serve);
  cmd.add_flag("--plain", f->plain,
               "Plain TCP: no encryption or authentication (must be given on both sides)");
  cmd.add_option("--ca", f->ca, "PEM: the CA both certificates chain to")->type_name("FILE");
  cmd.add_option("--cert", f->cert, "PEM: this side's certificate (SAN strait://region/<name>)")
      ->type_name("FILE");
  cmd.add_option("--key", f->key, "PEM: this side's private key")->type_name("FILE");
  cmd.add_option("--region", f->region,
                 "This side's region (default: the certificate's, or bench-client/bench-server "
                 "with --plain)")
      ->type_name("NAME");
  cmd.add_option("--peer-region", f->peer_region,
                 "The server's region (client) or the regions allowed to connect (server, "
                 "comma-separated); required with TLS")
      ->type_name("NAME");
  cmd.add_option("--duration", f->duration, "Measured window per test (e.g. 5s, 300ms)")
      ->type_name("TIME")
      ->default_str("5s");
  cmd.add_option("--warmup", f->warmup, "Before each window (default: half of it, 0.1-2 s)")
      ->type_name("TIME");
  cmd.add_option("--streams", f->streams, "Tests: stream counts and/or 'adaptive'")
      ->type_name("LIST")
      ->default_str(kLinkBenchDefaultStreams);
  cmd.add_option("--max-streams", f->max_streams, "Adaptive mode's ceiling")
      ->check(IntValidator(1, 64))
      ->type_name("N")
      ->default_str("64");
  cmd.add_option("--cc", f->cc, "Congestion control of every stream: bbr, cubic, reno "
                                "(default: the system's)")
      ->type_name("NAME");
  cmd.add_option("--codecs", f->codecs, "Codecs to rate on this link (none, zstd, int8, int4, "
                                        "fp8; int8+zstd etc.)")
      ->type_name("LIST")
      ->default_str(kLinkBenchDefaultCodecs);
  cmd.add_option("--chunk", f->chunk, "Chunk size, or 'auto' (follows bandwidth x RTT)")
      ->type_name("SIZE")
      ->default_str("auto");
  cmd.add_option("--message", f->message, "Bytes per Send")
      ->transform(SizeValidator(64 * 1024, uint64_t{256} << 20))
      ->type_name("SIZE")
      ->default_str("4MiB");
  cmd.add_option("--inflight", f->inflight, "Bytes kept submitted and not yet acknowledged")
      ->transform(SizeValidator(64 * 1024, uint64_t{4} << 30))
      ->type_name("SIZE")
      ->default_str("64MiB");
  cmd.add_option("--inflight-per-stream", f->inflight_per_stream,
                 "lib/net's max_inflight_per_stream (default: lib/net's)")
      ->transform(SizeValidator(64 * 1024, uint64_t{1} << 30))
      ->type_name("SIZE");
  cmd.add_option("--notsent-lowat", f->notsent_lowat,
                 "TCP_NOTSENT_LOWAT per stream, 0 = unset (default: lib/net's)")
      ->type_name("SIZE");
  cmd.add_option("--link-rate", f->link_rate, "The link's rate, printed as the bound (100mbit)")
      ->type_name("RATE");
  cmd.add_option("--codec-size", f->codec_size, "Gradient bytes per codec measurement")
      ->transform(SizeValidator(64 * 1024, uint64_t{256} << 20))
      ->type_name("SIZE")
      ->default_str("16MiB");

  return [f](const GlobalFlags& globals) -> int {
    if (!f->serve && f->connect.empty()) {
      return UsageError(kCommand, "--serve/--connect", "give --serve or --connect HOST:PORT");
    }
    net::EndpointOptions e;
    e.transport = f->plain ? net::Transport::kPlainTcp : net::Transport::kTls;
    if (f->plain) {
      if (!f->ca.empty() || !f->cert.empty() || !f->key.empty()) {
        return UsageError(kCommand, "--plain", "plain TCP uses no --ca/--cert/--key");
      }
      e.region = !f->region.empty() ? f->region
                                    : (f->serve ? kDefaultServerRegion : kDefaultClientRegion);
      std::vector<std::string> peers = SplitList(f->peer_region);
      if (peers.empty()) peers = {f->serve ? kDefaultClientRegion : kDefaultServerRegion};
      e.peer_regions = peers;
    } else {
      if (f->ca.empty() || f->cert.empty() || f->key.empty()) {
        return UsageError(kCommand, "--ca/--cert/--key",
                          "TLS needs all three PEM files (or --plain on both sides)");
      }
      e.ca_file = f->ca;
      e.cert_file = f->cert;
      e.key_file = f->key;
      if (f->region.empty()) {
        StatusOr<std::string> own = net::RegionOfCertificateFile(f->cert);
        if (!own.ok()) return UsageError(kCommand, "--cert", own.status().message());
        e.region = *own;
      } else {
        e.region = f->region;
      }
      e.peer_regions = SplitList(f->peer_region);
      if (e.peer_regions.empty()) {
        return UsageError(kCommand, "--peer-region",
                          f->serve ? "name the regions allowed to connect (their certificates')"
                                   : "name the server's region (its certificate's)");
      }
    }
    if (!f->serve && e.peer_regions.size() != 1) {
      return UsageError(kCommand, "--peer-region", "the client names one server region");
    }

    if (f->serve) {
      StatusOr<std::pair<std::string, uint16_t>> listen = ParseHostPort(f->listen);
      if (!listen.ok()) return UsageError(kCommand, "--listen", listen.status().message());
      Status s = RunLinkServer(e, listen->first, listen->second, f->one_off);
      if (!s.ok()) {
        std::cerr << "strait-bench link: server: " << s << '\n';
        return kExitFailure;
      }
      return kExitOk;
    }

    LinkBenchOptions o;
    StatusOr<std::pair<std::string, uint16_t>> where = ParseHostPort(f->connect);
    if (!where.ok()) return UsageError(kCommand, "--connect", where.status().message());
    o.host = where->first;
    o.port = where->second;
    if (o.port == 0) return UsageError(kCommand, "--connect", "port 0 cannot be connected to");
    StatusOr<int64_t> duration = ParseDurationNanos(f->duration);
    if (!duration.ok() || *duration <= 0) {
      return UsageError(kCommand, "--duration",
                        duration.ok() ? "must be positive" : duration.status().message());
    }
    o.duration_ns = *duration;
    if (!f->warmup.empty()) {
      StatusOr<int64_t> warmup = ParseDurationNanos(f->warmup);
      if (!warmup.ok()) return UsageError(kCommand, "--warmup", warmup.status().message());
      o.warmup_ns = *warmup;
    }
    o.max_streams = f->max_streams;
    StatusOr<std::vector<StreamSpec>> streams = ParseStreamList(f->streams, 64);
    if (!streams.ok()) return UsageError(kCommand, "--streams", streams.status().message());
    o.streams = *std::move(streams);
    o.congestion_control = f->cc;
    if (Status s = net::CheckCongestionControl(f->cc); !s.ok()) {
      return UsageError(kCommand, "--cc", s.message());
    }
    if (f->chunk != "auto") {
      StatusOr<uint64_t> chunk = ParseSize(f->chunk);
      if (!chunk.ok() || *chunk < 4096 || *chunk > (uint64_t{16} << 20)) {
        return UsageError(kCommand, "--chunk",
                          "expected 'auto' or a size from 4 KiB to 16 MiB, got '" + f->chunk +
                              "'");
      }
      o.chunk_bytes = static_cast<uint32_t>(*chunk);
    }
    o.message_bytes = f->message;
    o.inflight_bytes = f->inflight;
    if (o.inflight_bytes < o.message_bytes) {
      return UsageError(kCommand, "--inflight", "must be at least --message");
    }
    o.max_inflight_per_stream = f->inflight_per_stream;
    if (!f->notsent_lowat.empty()) {
      StatusOr<uint64_t> lowat = ParseSize(f->notsent_lowat);
      if (!lowat.ok() || *lowat > (uint64_t{1} << 30)) {
        return UsageError(kCommand, "--notsent-lowat",
                          "expected a size up to 1 GiB (0 = unset), got '" + f->notsent_lowat +
                              "'");
      }
      o.notsent_lowat = static_cast<int64_t>(*lowat);
    }
    if (!f->link_rate.empty()) {
      StatusOr<uint64_t> rate = ParseRate(f->link_rate);
      if (!rate.ok() || *rate == 0) {
        return UsageError(kCommand, "--link-rate",
                          rate.ok() ? "must be positive" : rate.status().message());
      }
      o.link_rate_bps = static_cast<double>(*rate);
    }
    for (const std::string& item : SplitList(f->codecs)) {
      // The codec bench's parser, with the link's own list in the error: the codec bench's
      // accepted forms (reduce, decode-acc, +ef) are rows this bench does not run.
      StatusOr<CodecRowSpec> spec = ParseCodecRowSpec(item);
      if (!spec.ok() || spec->kind != CodecRowSpec::Kind::kCodec || spec->feedback) {
        return UsageError(kCommand, "--codecs",
                          "'" + item + "' is not a codec this bench rates; accepted: none, "
                          "zstd, int8, int4, fp8, or a lossy one followed by +zstd (int8+zstd)");
      }
      o.codecs.push_back(*std::move(spec));
    }
    o.codec_bytes = f->codec_size;
    o.endpoint = std::move(e);

    ProgressLine progress;
    StatusOr<LinkBenchReport> report = RunLinkBench(o, &progress);
    progress.Clear();
    if (!report.ok()) {
      std::cerr << "strait-bench link: FAILED: " << report.status().ToString() << '\n';
      return kExitFailure;
    }
    std::cout << (globals.json ? FormatLinkReportJson(*report) : FormatLinkReportTable(*report));
    std::cout.flush();
    return kExitOk;
  };
}

}  // namespace strait::bench
