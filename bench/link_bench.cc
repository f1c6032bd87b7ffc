// `strait-bench link`: the server that sinks data and the client that measures goodput per
// stream count, codec effectiveness on the link, and the recommended configuration. See
// link_bench.h for the protocol; the report's table and JSON are in link_bench_report.cc, the
// command line in link_bench_cli.cc.
#include "bench/link_bench.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench/bench_common.h"
#include "bench/gradient.h"
#include "bench/link_bench_internal.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/units.h"
#include "net/adapt.h"
#include "net/socket_options.h"
#include "net/tls.h"
#include "strait/codec.h"
#include "tools/cli/cli.h"

namespace strait::bench {
namespace {

// Warm-up when --warmup is not given: half the window, within these bounds. Two seconds cover
// slow start and BBR's startup at 100-200 ms RTT.
constexpr int64_t kMinAutoWarmupNs = 100'000'000;
constexpr int64_t kMaxAutoWarmupNs = 2'000'000'000;
// How long a data link may take to bring its streams up (TCP + TLS at WAN RTTs, K of them).
constexpr double kStreamsUpSeconds = 20;
constexpr int64_t kSampleNs = 100'000'000;
// How long a closed link may take to flush its close records (a chunk write in progress first).
constexpr double kDrainSeconds = 3;
// Chunk sizes the recommendation chooses between (lib/net's adapt_chunk bounds).
constexpr uint32_t kMinChunk = 64 * 1024;
constexpr uint32_t kMaxChunk = 4 * 1024 * 1024;
constexpr uint32_t kDefaultChunk = 256 * 1024;
// A fixed stream count within this share of the best is as good as the best (fewer streams are
// cheaper), and adaptive mode within it of the best fixed count is preferred (it follows
// changes).
constexpr double kNearBest = 0.97;
// ChooseCodec is linear in the message size; this only names the unit of the comparison.
constexpr uint64_t kCodecModelBytes = uint64_t{64} << 20;

using link_bench_internal::Mbit;
using link_bench_internal::Ms;
using link_bench_internal::Where;

double ProcessCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

std::string SystemCongestionControl() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string name;
  if (!(in >> name)) return "system default";
  return name;
}

std::string TransportName(net::Transport t) {
  return t == net::Transport::kTls ? "tls" : "plain";
}

// Keeps `inflight_bytes` of messages submitted on a link: each completion submits the next
// message, on the link's I/O thread, so that the link always has a backlog to cut chunks from.
class Sender : public std::enable_shared_from_this<Sender> {
 public:
  Sender(std::weak_ptr<net::Link> link, uint64_t message_bytes, uint64_t inflight_bytes,
         int64_t deadline_ns)
      : link_(std::move(link)),
        message_bytes_(message_bytes),
        inflight_bytes_(inflight_bytes),
        deadline_ns_(deadline_ns) {}

  // Thread-safe; called once by the measuring thread and then by every completion.
  void Refill() {
    while (!stop_.load()) {
      uint64_t current = outstanding_.load();
      if (current + message_bytes_ > inflight_bytes_) return;
      if (!outstanding_.compare_exchange_weak(current, current + message_bytes_)) continue;
      std::shared_ptr<net::Link> link = link_.lock();
      if (!link) return;
      link->Send(kLinkBenchDataChannel, std::vector<uint8_t>(message_bytes_),
                 Deadline::After(deadline_ns_), [self = shared_from_this()](Status s) {
                   self->outstanding_ -= self->message_bytes_;
                   if (!s.ok()) {
                     self->Fail(std::move(s));
                     return;
                   }
                   self->Refill();
                 });
    }
  }

  // Stops submitting; sends that fail after this (the link is being closed) are not errors.
  void Stop() { stop_.store(true); }

  Status error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  void Fail(Status s) {
    if (stop_.exchange(true)) return;
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(s);
  }

  std::weak_ptr<net::Link> link_;
  const uint64_t message_bytes_;
  const uint64_t inflight_bytes_;
  const int64_t deadline_ns_;
  std::atomic<uint64_t> outstanding_{0};
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  Status error_;
};

// lib/net warns once per plain-TCP endpoint; the client makes one per measurement, and one
// warning per run is enough (RunLinkBench prints it first).
StatusOr<std::unique_ptr<net::Endpoint>> CreateQuietly(const net::EndpointOptions& options,
                                                       bool quiet) {
  auto no_accept = [](std::shared_ptr<net::Link>) { return net::MessageCallback(); };
  const LogLevel level = GetLogLevel();
  const bool lower = quiet && options.transport == net::Transport::kPlainTcp &&
                     (level == LogLevel::kWarn || level == LogLevel::kInfo);
  if (lower) SetLogLevel(LogLevel::kError);
  auto endpoint = net::Endpoint::Create(options, no_accept);
  if (lower) SetLogLevel(level);
  return endpoint;
}

net::EndpointOptions DataEndpointOptions(const LinkBenchOptions& o, const StreamSpec& spec) {
  net::EndpointOptions e = o.endpoint;
  net::LinkOptions& l = e.link;
  l.congestion_control = o.congestion_control;
  if (spec.adaptive()) {
    l.adapt_streams = true;
    l.min_streams = 1;
    l.max_streams = o.max_streams;
    l.streams = std::min(l.streams, o.max_streams);  // lib/net's default start
  } else {
    l.adapt_streams = false;
    l.streams = spec.streams;
    l.min_streams = 1;
    l.max_streams = std::max(spec.streams, l.max_streams);
  }
  if (o.chunk_bytes == 0) {
    l.adapt_chunk = true;
    l.chunk_bytes = kDefaultChunk;
    l.min_chunk_bytes = kMinChunk;
    l.max_chunk_bytes = kMaxChunk;
  } else {
    l.adapt_chunk = false;
    l.chunk_bytes = o.chunk_bytes;
    l.min_chunk_bytes = std::min(l.min_chunk_bytes, o.chunk_bytes);
  }
  if (o.max_inflight_per_stream > 0) l.max_inflight_per_stream = o.max_inflight_per_stream;
  if (o.notsent_lowat >= 0) l.notsent_lowat = static_cast<uint32_t>(o.notsent_lowat);
  return e;
}

// Closes `link` and waits (briefly) until its close records went out and its streams closed.
// Destroying the endpoint at once would also close them (it waits up to half a second for close
// records), but the next measurement should not start while this link's streams still drain.
void CloseAndDrain(net::Link& link) {
  link.Close();
  const Deadline deadline = Deadline::AfterSeconds(kDrainSeconds);
  while (link.Estimates().streams_up > 0 && !deadline.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

StatusOr<StreamResult> MeasureStreams(const LinkBenchOptions& o, const StreamSpec& spec,
                                      int64_t warmup_ns, const std::string& prefix,
                                      ProgressLine* progress) {
  auto say = [&](const std::string& text) {
    if (progress != nullptr) progress->Update(prefix + text);
  };
  say("connecting");
  STRAIT_ASSIGN_OR_RETURN(std::unique_ptr<net::Endpoint> endpoint,
                          CreateQuietly(DataEndpointOptions(o, spec), /*quiet=*/true));
  STRAIT_ASSIGN_OR_RETURN(
      std::shared_ptr<net::Link> link,
      endpoint->Connect(o.endpoint.peer_regions.front(), o.host, o.port,
                        [](uint32_t, std::vector<uint8_t>) {}));
  const int want = spec.adaptive() ? 1 : spec.streams;
  if (Status s = link->WaitForStreams(want, Deadline::AfterSeconds(kStreamsUpSeconds)); !s.ok()) {
    link->Close();
    return s.WithContext("bringing up " + std::to_string(want) + " streams to " + Where(o));
  }

  const int64_t total_ns = warmup_ns + o.duration_ns;
  auto sender = std::make_shared<Sender>(link, o.message_bytes, o.inflight_bytes,
                                         total_ns + int64_t{120'000'000'000});
  const int64_t start = MonotonicNanos();
  sender->Refill();

  StreamResult r;
  r.spec = spec;
  net::LinkEstimates first{};
  int64_t first_ns = 0;
  double first_cpu = 0;
  bool measuring = false;
  uint64_t last_acked = 0;
  int64_t last_ns = start;
  double recent_bps = 0;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::nanoseconds(kSampleNs));
    const int64_t now = MonotonicNanos();
    const net::LinkEstimates e = link->Estimates();
    if (Status s = sender->error(); !s.ok()) {
      link->Close();
      return s.WithContext("sending on " + std::to_string(e.streams_up) + " streams to " +
                           Where(o));
    }
    if (now > last_ns) {
      recent_bps = static_cast<double>(e.bytes_acked - last_acked) * 8e9 /
                   static_cast<double>(now - last_ns);
    }
    last_acked = e.bytes_acked;
    last_ns = now;
    if (!measuring && now - start >= warmup_ns) {
      measuring = true;
      first = e;
      first_ns = now;
      first_cpu = ProcessCpuSeconds();
    }
    const int64_t left = measuring ? o.duration_ns - (now - first_ns) : warmup_ns - (now - start);
    say(std::string(measuring ? "measuring, " : "warm-up, ") +
        Fixed(static_cast<double>(std::max<int64_t>(left, 0)) * 1e-9, 1) + " s left: " +
        Mbit(recent_bps) + " Mbit/s, " + std::to_string(e.streams_up) + " streams, rtt " +
        Ms(e.rtt_smoothed_ns) + " ms");
    if (measuring && now - first_ns >= o.duration_ns) {
      const double seconds = static_cast<double>(now - first_ns) * 1e-9;
      r.seconds = seconds;
      r.bytes_acked = e.bytes_acked - first.bytes_acked;
      r.goodput_bps = static_cast<double>(r.bytes_acked) * 8 / seconds;
      r.retransmissions = e.tcp_retransmissions - first.tcp_retransmissions;
      r.stream_failures = e.stream_failures - first.stream_failures;
      r.rtt_min_ns = e.rtt_min_ns;
      r.rtt_smoothed_ns = e.rtt_smoothed_ns;
      r.tcp_rtt_ns = e.tcp_rtt_ns;
      r.streams_end = spec.adaptive() ? e.streams_target : e.streams_up;
      r.chunk_bytes = e.chunk_bytes;
      r.cpu_fraction = (ProcessCpuSeconds() - first_cpu) / seconds;
      r.estimates = e;
      break;
    }
  }
  sender->Stop();
  CloseAndDrain(*link);
  endpoint.reset();  // joins the I/O thread; the sends still queued fail as cancelled
  return r;
}

// Single-thread speed and ratio of one codec on gradient-like fp32 data.
StatusOr<CodecLinkResult> MeasureCodec(const CodecRowSpec& spec, const std::vector<float>& data,
                                       int iters) {
  CodecLinkResult r;
  r.codec = spec.name;
  r.lossless = !IsLossyCodec(spec.codec.codec);
  CodecOptions co = spec.codec;
  const size_t count = data.size();
  const size_t bytes = count * sizeof(float);
  std::vector<uint8_t> frame(MaxFrameSize(count, DataType::kFloat32, co));
  std::vector<float> out(count);
  Encoder encoder;
  Decoder decoder;
  size_t frame_bytes = 0;
  double best_encode = 1e30;
  double best_decode = 1e30;
  for (int i = 0; i <= iters; ++i) {  // the first round warms contexts and caches
    Stopwatch watch;
    STRAIT_ASSIGN_OR_RETURN(frame_bytes,
                            encoder.EncodeInto(data.data(), count, DataType::kFloat32, co, frame));
    const double encode = watch.ElapsedSeconds();
    watch.Restart();
    STRAIT_RETURN_IF_ERROR(decoder.Decode(std::span<const uint8_t>(frame.data(), frame_bytes),
                                          out.data(), count, DataType::kFloat32));
    const double decode = watch.ElapsedSeconds();
    if (i == 0) continue;
    best_encode = std::min(best_encode, encode);
    best_decode = std::min(best_decode, decode);
  }
  if (r.lossless && std::memcmp(out.data(), data.data(), bytes) != 0) {
    return DataLossError("codec " + spec.name + " did not decode bit-exact");
  }
  r.ratio = static_cast<double>(bytes) / static_cast<double>(frame_bytes);
  r.encode_bytes_per_s = static_cast<double>(bytes) / std::max(best_encode, 1e-9);
  r.decode_bytes_per_s = static_cast<double>(bytes) / std::max(best_decode, 1e-9);
  return r;
}

// Fills the effective throughput on a link of `goodput_bytes_per_s` (the model ChooseCodec uses;
// raw bytes for "none", which needs no encoding at all).
void ApplyLink(double goodput_bytes_per_s, CodecLinkResult* r) {
  if (r->codec == "none") {
    r->effective_bps = goodput_bytes_per_s * 8;
    r->bottleneck = "link";
    return;
  }
  const double encode = 1 / r->encode_bytes_per_s;
  const double wire = goodput_bytes_per_s > 0 ? 1 / (r->ratio * goodput_bytes_per_s) : 1e30;
  const double decode = 1 / r->decode_bytes_per_s;
  const double worst = std::max({encode, wire, decode});
  r->effective_bps = 8 / worst;
  r->bottleneck = worst == wire ? "link" : worst == encode ? "encode" : "decode";
}

// Fewer streams are cheaper: the smallest K within kNearBest of the best fixed K; adaptive when
// it measured within kNearBest of that too.
Recommendation Recommend(const LinkBenchReport& report, const std::vector<CodecRowSpec>& specs) {
  Recommendation rec;
  rec.congestion_control = report.congestion_control;
  const StreamResult* best_fixed = nullptr;
  const StreamResult* adaptive = nullptr;
  double best = 0;
  for (const StreamResult& t : report.tests) {
    if (t.spec.adaptive()) {
      adaptive = &t;
    } else {
      best = std::max(best, t.goodput_bps);
    }
  }
  for (const StreamResult& t : report.tests) {
    if (t.spec.adaptive() || t.goodput_bps < kNearBest * best) continue;
    if (best_fixed == nullptr || t.spec.streams < best_fixed->spec.streams) best_fixed = &t;
  }
  const StreamResult* chosen = best_fixed;
  if (adaptive != nullptr &&
      (best_fixed == nullptr || adaptive->goodput_bps >= kNearBest * best_fixed->goodput_bps)) {
    chosen = adaptive;
  }
  if (chosen == nullptr) return rec;
  rec.streams = chosen->spec.adaptive()
                    ? "adaptive (settled at " + std::to_string(chosen->streams_end) + ")"
                    : std::to_string(chosen->spec.streams);
  rec.goodput_bps = chosen->goodput_bps;
  net::LinkEstimates est = chosen->estimates;
  est.goodput_bytes_per_s = chosen->goodput_bps / 8;
  rec.chunk_bytes = net::ChooseChunkBytes(est, std::max(1, chosen->streams_end),
                                          chosen->chunk_bytes > 0 ? chosen->chunk_bytes
                                                                  : kDefaultChunk,
                                          kMinChunk, kMaxChunk);

  // Each row is offered to ChooseCodec alone (rows may share a CodecId, e.g. int8 and
  // int8+zstd); the fastest expected transfer wins, raw bytes when nothing beats them.
  rec.codec = "none";
  double best_seconds = static_cast<double>(kCodecModelBytes) / est.goodput_bytes_per_s;
  rec.effective_bps = chosen->goodput_bps;
  for (size_t i = 0; i < report.codecs.size() && i < specs.size(); ++i) {
    const CodecLinkResult& c = report.codecs[i];
    if (c.codec == "none") continue;
    const net::CodecProfile profile{specs[i].codec.codec, c.encode_bytes_per_s,
                                    c.decode_bytes_per_s, c.ratio};
    const CodecId allowed = specs[i].codec.codec;
    const net::CodecChoice choice =
        net::ChooseCodec(est, std::span<const net::CodecProfile>(&profile, 1),
                         std::span<const CodecId>(&allowed, 1), kCodecModelBytes);
    if (choice.codec != CodecId::kNone && choice.expected_seconds < best_seconds) {
      best_seconds = choice.expected_seconds;
      rec.codec = c.codec;
      rec.effective_bps = c.effective_bps;
    }
  }
  return rec;
}

}  // namespace

std::string StreamSpec::Label() const { return adaptive() ? "adaptive" : std::to_string(streams); }

StatusOr<std::vector<StreamSpec>> ParseStreamList(std::string_view text, int max_streams) {
  std::vector<StreamSpec> out;
  for (const std::string& item : SplitList(text)) {
    StreamSpec spec;
    if (item == "adaptive" || item == "adapt" || item == "auto") {
      spec.streams = 0;
    } else {
      int k = 0;
      auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), k);
      if (ec != std::errc() || ptr != item.data() + item.size() || k < 1 || k > max_streams) {
        return InvalidArgumentError("expected stream counts 1.." + std::to_string(max_streams) +
                                    " or 'adaptive', got '" + item + "'");
      }
      spec.streams = k;
    }
    out.push_back(spec);
  }
  if (out.empty()) return InvalidArgumentError("empty; expected e.g. 1,2,4,8,16,adaptive");
  return out;
}

StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view text) {
  std::string host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgumentError("expected [IPV6]:PORT, got '" + std::string(text) + "'");
    }
    host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0 ||
        text.find(':') != colon) {
      return InvalidArgumentError("expected HOST:PORT with a numeric address (10.0.0.7:" +
                                  std::to_string(kLinkBenchDefaultPort) + "), got '" +
                                  std::string(text) + "'");
    }
    host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port > 65535) {
    return InvalidArgumentError("bad port '" + std::string(port_text) + "' in '" +
                                std::string(text) + "' (0-65535)");
  }
  return std::make_pair(host, static_cast<uint16_t>(port));
}

StatusOr<LinkBenchReport> RunLinkBench(const LinkBenchOptions& o, ProgressLine* progress) {
  LinkBenchReport report;
  report.options = o;
  report.transport = TransportName(o.endpoint.transport);
  report.congestion_control =
      o.congestion_control.empty() ? SystemCongestionControl() : o.congestion_control;
  report.date = UtcTimestamp();
  report.cpu = CpuModelName();
  report.warmup_ns =
      o.warmup_ns >= 0 ? o.warmup_ns
                       : std::clamp(o.duration_ns / 2, kMinAutoWarmupNs, kMaxAutoWarmupNs);

  // The control link: announces each measurement to the server (its log) and the end (--one-off).
  if (progress != nullptr) progress->Update("connecting to " + Where(o));
  net::EndpointOptions control_options = o.endpoint;
  control_options.link.streams = 1;
  STRAIT_ASSIGN_OR_RETURN(std::unique_ptr<net::Endpoint> control_endpoint,
                          CreateQuietly(control_options, /*quiet=*/false));
  STRAIT_ASSIGN_OR_RETURN(
      std::shared_ptr<net::Link> control,
      control_endpoint->Connect(o.endpoint.peer_regions.front(), o.host, o.port,
                                [](uint32_t, std::vector<uint8_t>) {}));
  if (Status s = control->WaitForStreams(1, Deadline::AfterSeconds(kStreamsUpSeconds)); !s.ok()) {
    return s.WithContext("no server answered at " + Where(o) + " (is `strait-bench link --serve` "
                         "running there, with the same --plain setting?)");
  }
  auto tell = [&](const std::string& text) {
    return control->SendAndWait(kLinkBenchControlChannel,
                                std::vector<uint8_t>(text.begin(), text.end()),
                                Deadline::AfterSeconds(kStreamsUpSeconds));
  };

  const size_t total = o.streams.size();
  for (size_t i = 0; i < total; ++i) {
    const StreamSpec& spec = o.streams[i];
    STRAIT_RETURN_IF_ERROR(tell("test streams=" + spec.Label()));
    const std::string prefix = "[" + std::to_string(i + 1) + "/" + std::to_string(total) + "] " +
                               (spec.adaptive() ? "adaptive" : spec.Label() + " streams") + ": ";
    STRAIT_ASSIGN_OR_RETURN(StreamResult r,
                            MeasureStreams(o, spec, report.warmup_ns, prefix, progress));
    report.tests.push_back(std::move(r));
  }
  tell("done").IgnoreError();  // the measurements are made; a server gone now changes nothing
  CloseAndDrain(*control);
  control_endpoint.reset();

  double best_bps = 0;
  for (const StreamResult& t : report.tests) best_bps = std::max(best_bps, t.goodput_bps);
  if (!o.codecs.empty()) {
    if (progress != nullptr) progress->Update("codecs: generating gradient-like data");
    const std::vector<float> data = MakeGradient(o.codec_bytes / sizeof(float), 1);
    for (const CodecRowSpec& spec : o.codecs) {
      if (progress != nullptr) progress->Update("codecs: " + spec.name);
      STRAIT_ASSIGN_OR_RETURN(CodecLinkResult c, MeasureCodec(spec, data, o.codec_iters));
      ApplyLink(best_bps / 8, &c);
      report.codecs.push_back(std::move(c));
    }
  }
  report.recommended = Recommend(report, o.codecs);
  if (progress != nullptr) progress->Clear();
  return report;
}

namespace {

// State the server's I/O-thread callbacks share with its main thread.
struct ServerState {
  std::mutex mu;  // serialises stdout lines
  std::atomic<bool> client_done{false};
};

}  // namespace

Status RunLinkServer(const net::EndpointOptions& options, const std::string& address,
                     uint16_t port, bool one_off) {
  // Blocked before the I/O thread starts (it inherits the mask), so that SIGINT and SIGTERM
  // reach the sigtimedwait below and the endpoint shuts down cleanly.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto state = std::make_shared<ServerState>();
  auto on_accept = [state](std::shared_ptr<net::Link> link) {
    const std::string peer = link->peer_region();
    return net::MessageCallback([state, peer](uint32_t channel, std::vector<uint8_t> message) {
      if (channel != kLinkBenchControlChannel) return;  // data: counted by the link, dropped
      const std::string text(message.begin(), message.end());
      {
        std::lock_guard<std::mutex> lock(state->mu);
        std::cout << "client " << peer << ": " << text << std::endl;
      }
      if (text == "done") state->client_done.store(true);
    });
  };
  STRAIT_ASSIGN_OR_RETURN(std::unique_ptr<net::Endpoint> endpoint,
                          net::Endpoint::Create(options, on_accept));
  STRAIT_ASSIGN_OR_RETURN(uint16_t bound, endpoint->Listen(address, port));
  {
    std::lock_guard<std::mutex> lock(state->mu);
    std::cout << "strait-bench link: listening on " << address << ":" << bound << " ("
              << TransportName(options.transport) << ", region " << options.region << ")"
              << std::endl;
  }
  for (;;) {
    timespec wait{0, 100'000'000};
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGINT || sig == SIGTERM) break;
    if (one_off && state->client_done.load()) {
      // Let the last acknowledgement reach the client before the streams close.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      break;
    }
  }
  endpoint.reset();
  return Status::Ok();
}

}  // namespace strait::bench
