// straitd's operational surface (gateway_impl.h, "Operations"): the Prometheus metrics it
// exports, what it records per all-reduce, and the /metrics, /healthz, /readyz HTTP endpoints.
//
// Most series are copied in at scrape time from where they already live (link estimates, the
// endpoint's refusal counters, the gateway's atomic counters), so the request paths pay nothing
// for them; only per-job series (latency histogram, failures by status code, bytes) are
// recorded as all-reduces finish.
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/log_limiter.h"
#include "common/process_stats.h"
#include "common/units.h"
#include "common/version.h"
#include "gateway/gateway_impl.h"
#include "strait/types.h"

namespace strait::gateway {
namespace {

constexpr const char* kLog = "straitd";

struct FamilySpec {
  const char* name;
  MetricType type;
  const char* help;
};

// Every family straitd exports (names per Prometheus conventions; README lists them).
constexpr FamilySpec kFamilies[] = {
    {"strait_build_info", MetricType::kGauge,
     "Always 1; the labels say which straitd this is (version, git describe at build time)."},
    {"strait_peer_wait_seconds_total", MetricType::kCounter,
     "Time successful all-reduces waited for this peer region's frames beyond the others' (with "
     "one peer: time blocked on it); straggler detection's input."},
    {"strait_peer_slow", MetricType::kGauge,
     "1 while this peer region is named persistently slow by straggler detection."},
    {"strait_peer_up", MetricType::kGauge,
     "1 when the link to the peer gateway has at least one stream up and its hello arrived."},
    {"strait_peer_goodput_bytes_per_second", MetricType::kGauge,
     "Acknowledged payload bytes per second on the link (EWMA while busy; 0 = not measured)."},
    {"strait_peer_rtt_min_seconds", MetricType::kGauge,
     "Least round-trip time seen by the link's pings (0 = not measured)."},
    {"strait_peer_rtt_smoothed_seconds", MetricType::kGauge,
     "Smoothed round-trip time of the link's pings, queueing behind data included."},
    {"strait_peer_streams", MetricType::kGauge, "TCP streams of the link that are up."},
    {"strait_peer_pacing_bytes_per_second", MetricType::kGauge,
     "The link's pacing cap in force, its streams' kernel pacing rates summed (link.max_rate / "
     "8; 0 = unpaced)."},
    {"strait_peer_streams_target", MetricType::kGauge,
     "Streams the link aims for (K, adapted on goodput; dialing side)."},
    {"strait_peer_tcp_retransmissions_total", MetricType::kCounter,
     "TCP retransmissions over every stream the link ever had (kernel TCP_INFO)."},
    {"strait_peer_chunks_resent_total", MetricType::kCounter,
     "Chunks written again on another stream after their stream died."},
    {"strait_peer_stream_failures_total", MetricType::kCounter,
     "Streams of the link that died or could not be dialled."},
    {"strait_peer_sent_bytes_total", MetricType::kCounter,
     "Payload bytes written to the link (encoded frames, resends included)."},
    {"strait_peer_received_bytes_total", MetricType::kCounter,
     "Payload bytes read from the link (encoded frames, duplicates included)."},
    {"strait_local_connections_total", MetricType::kCounter,
     "Local client connections admitted on the Unix socket."},
    {"strait_errors_total", MetricType::kCounter,
     "Refusals and bad input by kind: refused_connection (local credentials), bad_request, "
     "refused_request (job of another uid), and refused WAN peers (tls_handshake, "
     "unknown_region, identity_mismatch, bad_hello, handshake_timeout)."},
    {"strait_allreduce_in_flight", MetricType::kGauge, "All-reduces running now."},
    {"strait_allreduces_total", MetricType::kCounter, "All-reduces completed OK, by job."},
    {"strait_allreduce_failures_total", MetricType::kCounter,
     "All-reduces that failed, by job and status code."},
    {"strait_allreduce_raw_bytes_total", MetricType::kCounter,
     "Tensor bytes clients handed in for all-reduces completed OK (before encoding)."},
    {"strait_allreduce_wan_raw_bytes_total", MetricType::kCounter,
     "Bytes the plain all-reduces completed OK would have sent over the WAN unencoded, by job."},
    {"strait_allreduce_wan_sent_bytes_total", MetricType::kCounter,
     "Encoded frame bytes all-reduces completed OK sent to peers, by job."},
    {"strait_allreduce_wan_received_bytes_total", MetricType::kCounter,
     "Encoded frame bytes all-reduces completed OK received from peers, by job."},
    // Cross-region tunnels: the NCCL plugin's point-to-point connections through straitd.
    {"strait_tunnels_open", MetricType::kGauge, "Tunnels open now."},
    {"strait_tunnels_opened_total", MetricType::kCounter, "Tunnels that were set up."},
    {"strait_tunnels_refused_total", MetricType::kCounter,
     "Tunnel requests refused (bad request, unknown listen, or the peer refused)."},
    {"strait_tunnels_failed_total", MetricType::kCounter,
     "Tunnels that ended with an error (a peer or rank lost, a deadline, bad frames)."},
    {"strait_tunnel_messages_sent_total", MetricType::kCounter, "Tunnel messages sent to peers."},
    {"strait_tunnel_messages_received_total", MetricType::kCounter,
     "Tunnel messages received from peers."},
    {"strait_tunnel_raw_bytes_sent_total", MetricType::kCounter,
     "Tunnel payload bytes as the ranks handed them in."},
    {"strait_tunnel_wire_bytes_sent_total", MetricType::kCounter,
     "Tunnel bytes sent over the links (after zstd where it paid)."},
    {"strait_tunnel_raw_bytes_received_total", MetricType::kCounter,
     "Tunnel payload bytes delivered to the ranks."},
    // The process's own, as Prometheus' client libraries name them (exported by the first shard).
    {"process_cpu_seconds_total", MetricType::kCounter, "User and system CPU time, in seconds."},
    {"process_resident_memory_bytes", MetricType::kGauge, "Resident memory size, in bytes."},
    {"process_virtual_memory_bytes", MetricType::kGauge, "Virtual memory size, in bytes."},
    {"process_open_fds", MetricType::kGauge, "Open file descriptors."},
    {"process_max_fds", MetricType::kGauge,
     "The descriptor limit (RLIMIT_NOFILE's soft limit; absent when unlimited)."},
    {"process_start_time_seconds", MetricType::kGauge,
     "Start time of the process, in seconds since the Unix epoch."},
    {"process_threads", MetricType::kGauge, "Threads of the process."},
    {"strait_compression_ratio", MetricType::kGauge,
     "strait_allreduce_wan_raw_bytes_total / strait_allreduce_wan_sent_bytes_total of plain "
     "all-reduces, by job (1 = no compression; absent until a plain all-reduce sent bytes)."},
};

}  // namespace

void Gateway::Impl::DeclareMetrics() {
  for (const FamilySpec& f : kFamilies) metrics.Declare(f.name, f.type, f.help);
  metrics.Declare("strait_allreduce_duration_seconds", MetricType::kHistogram,
                  "Wall time of all-reduces completed OK (request received to result ready), "
                  "by job.",
                  kLatencyBuckets);
  metrics.Set("strait_build_info",
              {{"version", ProjectVersion()}, {"git", GitDescribe()}}, 1);
}

void Gateway::Impl::RecordAllReduce(const Message& request, const Status& status,
                                    int64_t elapsed_ns, const collective::AllReduceStats& stats) {
  // `strait_job`, not `job`: Prometheus owns `job` (the scrape target's) and would rename ours.
  const MetricLabels job{{"strait_job", request.job}};
  if (!status.ok()) {
    metrics.Add("strait_allreduce_failures_total",
                {{"strait_job", request.job}, {"code", StatusCodeName(status.code())}}, 1);
    return;
  }
  metrics.Add("strait_allreduces_total", job, 1);
  metrics.Observe("strait_allreduce_duration_seconds", job, static_cast<double>(elapsed_ns) / 1e9);
  const double tensor_bytes =
      static_cast<double>(request.count) * static_cast<double>(DataTypeSize(request.dtype));
  metrics.Add("strait_allreduce_raw_bytes_total", job, tensor_bytes);
  metrics.Add("strait_allreduce_wan_sent_bytes_total", job, static_cast<double>(stats.bytes_sent));
  metrics.Add("strait_allreduce_wan_received_bytes_total", job,
              static_cast<double>(stats.bytes_received));
  RecordPeerWaits(stats);
  if ((request.type != MessageType::kAllReduce && request.type != MessageType::kAllReduceShm &&
       request.type != MessageType::kAllReduceFrame) ||
      world.size() < 2) {
    return;
  }
  // What an unencoded shard all-reduce sends: every shard but its own (S - s), then its own
  // reduced shard to each of the n - 1 others ((n - 1) s): S + (n - 2) s, s = its share.
  const std::vector<uint64_t> weights = config.ShardWeights();
  double share = 1.0 / static_cast<double>(world.size());
  if (!weights.empty()) {
    double sum = 0;
    for (uint64_t w : weights) sum += static_cast<double>(w);
    share = static_cast<double>(weights[static_cast<size_t>(rank)]) / sum;
  }
  const double n = static_cast<double>(world.size());
  metrics.Add("strait_allreduce_wan_raw_bytes_total", job,
              tensor_bytes * (1.0 + (n - 2.0) * share));
  const double sent = metrics.Value("strait_allreduce_wan_sent_bytes_total", job);
  const double raw = metrics.Value("strait_allreduce_wan_raw_bytes_total", job);
  if (sent > 0) metrics.Set("strait_compression_ratio", job, raw / sent);
}

void Gateway::Impl::RecordPeerWaits(const collective::AllReduceStats& stats) {
  // With two or more peers, how late each one's frames came against the earliest (independent of
  // the order the collective takes them in); with one there is nobody to compare with, and the
  // time blocked on it is measured against its own past (see straggler.h).
  const std::vector<int64_t>& waits = world.size() >= 3 ? stats.peer_late_ns : stats.peer_wait_ns;
  if (stragglers == nullptr || waits.size() != world.size()) return;
  const bool log_waits = LogEnabled(LogLevel::kDebug);  // the line is built only when logged
  std::string per_peer;
  for (size_t p = 0; p < world.size(); ++p) {
    if (static_cast<int>(p) == rank) continue;
    metrics.Add("strait_peer_wait_seconds_total", {{"peer", world[p]}},
                static_cast<double>(waits[p]) / 1e9);
    if (log_waits) per_peer += " " + world[p] + "=" + FormatDuration(waits[p]);
  }
  STRAIT_LOG(kDebug, kLog) << "op waits per peer:" << per_peer;
  for (const StragglerDetector::Verdict& v : stragglers->Record(waits)) {
    metrics.Set("strait_peer_slow", {{"peer", v.name}}, v.slow ? 1 : 0);
    const std::string what = "all-reduces waited " + FormatDuration(v.wait_ns) + " per op for region " +
                             v.name + " against " + FormatDuration(v.others_ns) + " for the others (" +
                             std::to_string(v.slow_ops) + " of the last ops slow)";
    if (!v.slow) {
      STRAIT_LOG(kInfo, kLog) << "region " << v.name << " is no longer slow: " << what;
      continue;
    }
    // A link that flaps between slow and not would repeat this line: one per key and minute.
    const LogRateLimiter::Decision d = straggler_log.Admit(v.name, MonotonicNanos());
    if (d.log) {
      STRAIT_LOG(kWarn, kLog) << "slow peer: " << what
                              << "; the link to it or its gateway is slow (check "
                                 "strait_peer_goodput_bytes_per_second and that gateway's load)"
                              << (d.suppressed > 0 ? " (+" + std::to_string(d.suppressed) +
                                                         " like it)"
                                                   : "");
    }
  }
}

std::string Gateway::Impl::MetricsText() {
  // Links by peer label: the peer regions' gateways, then this region's other gateways.
  std::vector<std::pair<std::string, std::shared_ptr<net::Link>>> peer_links;
  std::vector<bool> hello;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t p = 0; p < world.size(); ++p) {
      if (static_cast<int>(p) == rank) continue;
      peer_links.emplace_back(world[p], links[p]);
      hello.push_back(links[p] != nullptr && transport->PeerIncarnation(static_cast<int>(p)) != 0);
    }
    for (size_t i = 0; i < region_links.size(); ++i) {
      if (static_cast<int>(i) == config.shard_index) continue;
      peer_links.emplace_back(config.region + "/shard_" + std::to_string(i), region_links[i]);
      hello.push_back(region_links[i] != nullptr);
    }
  }
  for (const char* name :
       {"strait_peer_up", "strait_peer_goodput_bytes_per_second", "strait_peer_rtt_min_seconds",
        "strait_peer_rtt_smoothed_seconds", "strait_peer_streams", "strait_peer_streams_target",
        "strait_peer_pacing_bytes_per_second",
        "strait_peer_tcp_retransmissions_total", "strait_peer_chunks_resent_total",
        "strait_peer_stream_failures_total", "strait_peer_sent_bytes_total",
        "strait_peer_received_bytes_total"}) {
    metrics.Clear(name);
  }
  for (size_t i = 0; i < peer_links.size(); ++i) {
    const auto& [peer, link] = peer_links[i];
    const MetricLabels l{{"peer", peer}};
    if (link == nullptr) {
      metrics.Set("strait_peer_up", l, 0);
      continue;
    }
    const net::LinkEstimates e = link->Estimates();
    metrics.Set("strait_peer_up", l, hello[i] && e.streams_up > 0 && !e.unreachable ? 1 : 0);
    metrics.Set("strait_peer_goodput_bytes_per_second", l, e.goodput_bytes_per_s);
    metrics.Set("strait_peer_rtt_min_seconds", l, static_cast<double>(e.rtt_min_ns) / 1e9);
    metrics.Set("strait_peer_rtt_smoothed_seconds", l,
                static_cast<double>(e.rtt_smoothed_ns) / 1e9);
    metrics.Set("strait_peer_streams", l, e.streams_up);
    metrics.Set("strait_peer_streams_target", l, e.streams_target);
    metrics.Set("strait_peer_pacing_bytes_per_second", l,
                static_cast<double>(e.max_pacing_bytes_per_s));
    metrics.Set("strait_peer_tcp_retransmissions_total", l,
                static_cast<double>(e.tcp_retransmissions));
    metrics.Set("strait_peer_chunks_resent_total", l, static_cast<double>(e.chunks_resent));
    metrics.Set("strait_peer_stream_failures_total", l, static_cast<double>(e.stream_failures));
    metrics.Set("strait_peer_sent_bytes_total", l, static_cast<double>(e.bytes_sent));
    metrics.Set("strait_peer_received_bytes_total", l, static_cast<double>(e.bytes_received));
  }
  metrics.Set("strait_local_connections_total", {}, static_cast<double>(connections.load()));
  metrics.Set("strait_allreduce_in_flight", {}, in_flight.load());
  auto error = [&](const char* kind, uint64_t value) {
    metrics.Set("strait_errors_total", {{"kind", kind}}, static_cast<double>(value));
  };
  error("refused_connection", refused_connections.load());
  error("bad_request", bad_requests.load());
  error("refused_request", refused_requests.load());
  if (host->endpoint != nullptr && this == host->shards.front().get()) {
    // The endpoint is the process's: its refusals appear on the first shard.
    const net::EndpointCounters c = host->endpoint->Counters();
    error("tls_handshake", c.tls_handshake_failures);
    error("unknown_region", c.unknown_region);
    error("identity_mismatch", c.identity_mismatch);
    error("bad_hello", c.bad_magic + c.bad_version + c.bad_hello);
    error("handshake_timeout", c.handshake_timeouts);
    error("setup_overflow", c.setup_overflows);
  }
  if (tunnels != nullptr) {
    const TunnelService::Counters t = tunnels->GetCounters();
    metrics.Set("strait_tunnels_open", {}, static_cast<double>(t.open));
    metrics.Set("strait_tunnels_opened_total", {}, static_cast<double>(t.opened));
    metrics.Set("strait_tunnels_refused_total", {}, static_cast<double>(t.refused));
    metrics.Set("strait_tunnels_failed_total", {}, static_cast<double>(t.closed_with_error));
    metrics.Set("strait_tunnel_messages_sent_total", {}, static_cast<double>(t.messages_sent));
    metrics.Set("strait_tunnel_messages_received_total", {},
                static_cast<double>(t.messages_received));
    metrics.Set("strait_tunnel_raw_bytes_sent_total", {}, static_cast<double>(t.raw_bytes_sent));
    metrics.Set("strait_tunnel_wire_bytes_sent_total", {}, static_cast<double>(t.wire_bytes_sent));
    metrics.Set("strait_tunnel_raw_bytes_received_total", {},
                static_cast<double>(t.raw_bytes_received));
  }
  if (this == host->shards.front().get()) {
    if (auto p = ReadProcessStats(); p.ok()) {
      metrics.Set("process_cpu_seconds_total", {}, p->cpu_seconds);
      metrics.Set("process_resident_memory_bytes", {}, static_cast<double>(p->resident_bytes));
      metrics.Set("process_virtual_memory_bytes", {}, static_cast<double>(p->virtual_bytes));
      metrics.Set("process_open_fds", {}, static_cast<double>(p->open_fds));
      if (p->max_fds != 0) metrics.Set("process_max_fds", {}, static_cast<double>(p->max_fds));
      metrics.Set("process_start_time_seconds", {}, p->start_time_seconds);
      metrics.Set("process_threads", {}, static_cast<double>(p->threads));
    }
  }
  return metrics.Text();
}

std::string Gateway::Impl::MissingForReadiness() {
  std::string missing;
  auto add = [&](const std::string& what) { missing += (missing.empty() ? "" : "\n") + what; };
  std::vector<std::pair<std::string, std::shared_ptr<net::Link>>> peer_links;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t p = 0; p < world.size(); ++p) {
      if (static_cast<int>(p) == rank) continue;
      if (links[p] == nullptr || transport->PeerIncarnation(static_cast<int>(p)) == 0) {
        add("no link to the gateway of region " + world[p] + " (shard " +
            std::to_string(config.shard_index) + ")");
      } else {
        peer_links.emplace_back("region " + world[p], links[p]);
      }
    }
    for (size_t i = 0; i < region_links.size(); ++i) {
      if (static_cast<int>(i) == config.shard_index) continue;
      if (region_links[i] == nullptr) {
        add("no link to gateway shard_" + std::to_string(i) + " of this region");
      } else {
        peer_links.emplace_back("gateway shard_" + std::to_string(i) + " of this region",
                                region_links[i]);
      }
    }
  }
  for (const auto& [what, link] : peer_links) {
    const net::LinkEstimates e = link->Estimates();
    if (e.streams_up == 0 || e.unreachable) {
      add("link to " + what + " has no stream up (shard " + std::to_string(config.shard_index) +
          ")");
    }
  }
  return missing;
}

HttpResponse Gateway::Host::Readiness() {
  std::string missing, slow;
  auto add = [](std::string& to, const std::string& what) {
    if (!what.empty()) to += (to.empty() ? "" : "\n") + what;
  };
  if (local == nullptr || !local->serving() || shards.front()->stopping.load()) {
    add(missing, "local socket " + config.local_socket + " not served");
  }
  for (const auto& s : shards) {
    add(missing, s->MissingForReadiness());
    // A slow peer does not make this gateway unready (it still works, only slower), but the
    // detail is where an operator looking at a slow job reads first.
    const std::string text = s->stragglers != nullptr ? s->stragglers->SlowText() : "";
    if (!text.empty()) {
      slow += (slow.empty() ? "" : "; ") +
              (shards.size() > 1 ? "shard " + std::to_string(s->config.shard_index) + ": " : "") +
              text;
    }
  }
  if (missing.empty()) {
    return HttpResponse{200, slow.empty() ? "ready\n" : "ready\nslow peers: " + slow + "\n"};
  }
  if (!slow.empty()) add(missing, "slow peers: " + slow);
  return HttpResponse{503, "not ready:\n" + missing + "\n"};
}

std::string Gateway::Host::MetricsText() {
  // One shard: its series as they always were; several: each labelled with its shard.
  if (shards.size() == 1) return shards.front()->MetricsText();
  std::vector<std::pair<MetricLabels, const MetricsRegistry*>> parts;
  for (const auto& s : shards) {
    s->MetricsText();  // refreshes the series copied in before a scrape
    parts.push_back({{{"shard", std::to_string(s->config.shard_index)}}, &s->metrics});
  }
  return MetricsRegistry::MergedText(parts);
}

Status Gateway::Host::StartHttp() {
  if (!config.metrics_listen) return Status::Ok();
  auto server = HttpServer::Start(
      config.metrics_listen->host, config.metrics_listen->port,
      [this](const std::string& path) -> std::optional<HttpResponse> {
        if (path == "/metrics") {
          return HttpResponse{200, MetricsText(), "text/plain; version=0.0.4; charset=utf-8"};
        }
        if (path == "/healthz") return HttpResponse{200, "ok\n"};
        if (path == "/readyz") return Readiness();
        return std::nullopt;
      });
  if (!server.ok()) return server.status().WithContext("metrics.listen");
  http = std::move(server).value();
  STRAIT_LOG(kInfo, kLog) << "metrics on http://" << config.metrics_listen->ToString()
                          << "/metrics (also /healthz, /readyz)";
  return Status::Ok();
}

}  // namespace strait::gateway
