// `strait-bench link`'s report: the table a person reads and the JSON a script keeps (see
// link_bench.h for what is measured). Apart from the measurement so that a change of the
// report's form does not touch the code that measures.
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_common.h"
#include "bench/link_bench.h"
#include "bench/link_bench_internal.h"
#include "common/units.h"
#include "tools/cli/cli.h"

namespace strait::bench {
namespace {

using link_bench_internal::Mbit;
using link_bench_internal::Ms;
using link_bench_internal::Where;

}  // namespace

std::string FormatLinkReportTable(const LinkBenchReport& r) {
  const LinkBenchOptions& o = r.options;
  std::ostringstream out;
  out << "strait-bench link: " << o.endpoint.region << " -> " << o.endpoint.peer_regions.front()
      << " at " << Where(o) << ", "
      << (r.transport == "tls" ? "TLS 1.3" : "plain TCP (no encryption)")
      << ", congestion control " << r.congestion_control << "\n";
  std::vector<std::vector<std::string>> header = {
      {"date", r.date},
      {"cpu", r.cpu},
      {"window", FormatDuration(o.duration_ns) + " per test after " +
                     FormatDuration(r.warmup_ns) + " warm-up; " + FormatBytes(o.message_bytes) +
                     " messages, " + FormatBytes(o.inflight_bytes) + " submitted at a time"},
      {"chunk", o.chunk_bytes == 0 ? "adaptive (bandwidth x RTT / streams / 4)"
                                   : FormatBytes(o.chunk_bytes)},
      {"link rate", o.link_rate_bps ? FormatRate(*o.link_rate_bps) + " (--link-rate)"
                                    : "unknown (give --link-rate to see goodput / link)"},
  };
  out << AlignColumns(header, 2) << '\n';

  std::vector<std::vector<std::string>> table = {{"streams", "goodput Mbit/s", "x link",
                                                  "rtt min ms", "rtt avg ms", "tcp rtt ms",
                                                  "retrans", "chunk", "client cpu"}};
  for (const StreamResult& t : r.tests) {
    table.push_back(
        {t.spec.adaptive() ? "adaptive (K=" + std::to_string(t.streams_end) + ")" : t.spec.Label(),
         Mbit(t.goodput_bps),
         o.link_rate_bps ? Fixed(t.goodput_bps / *o.link_rate_bps, 3) : "-", Ms(t.rtt_min_ns),
         Ms(t.rtt_smoothed_ns), Ms(t.tcp_rtt_ns), std::to_string(t.retransmissions),
         FormatBytes(t.chunk_bytes), Fixed(100 * t.cpu_fraction, 0) + "%"});
  }
  out << AlignColumns(table, 1);
  out << "goodput: payload bytes the server acknowledged per second; rtt: lib/net pings queued "
         "behind data; tcp rtt: the kernel's;\nretrans: TCP segments retransmitted in the "
         "window; client cpu: this process, share of one core.\n";

  if (!r.codecs.empty()) {
    out << "\ncodecs on this link (fp32 gradient-like data, " + FormatBytes(o.codec_bytes) +
               ", one thread each side, at the best goodput above):\n";
    std::vector<std::vector<std::string>> codecs = {{"codec", "lossless", "ratio", "encode MB/s",
                                                     "decode MB/s", "effective Mbit/s",
                                                     "bottleneck"}};
    for (const CodecLinkResult& c : r.codecs) {
      const bool raw = c.codec == "none";
      codecs.push_back({c.codec, c.lossless ? "yes" : "no", raw ? "1.00" : Fixed(c.ratio, 2),
                        raw ? "-" : Fixed(c.encode_bytes_per_s / 1e6, 0),
                        raw ? "-" : Fixed(c.decode_bytes_per_s / 1e6, 0), Mbit(c.effective_bps),
                        c.bottleneck});
    }
    out << AlignColumns(codecs, 2);
    out << "effective: input bytes / max(encode time, wire time at the goodput, decode time).\n";
  }

  const Recommendation& rec = r.recommended;
  out << "\nrecommended configuration:\n";
  std::vector<std::vector<std::string>> rows = {
      {"  streams", rec.streams.empty() ? "-" : rec.streams,
       "(" + Mbit(rec.goodput_bps) + " Mbit/s measured)"},
      {"  chunk", rec.chunk_bytes > 0 ? FormatBytes(rec.chunk_bytes) : "-",
       "(a quarter of one stream's share of bandwidth x RTT)"},
      {"  codec", rec.codec,
       "(" + Mbit(rec.effective_bps) + " Mbit/s of input; net::ChooseCodec among --codecs)"},
      {"  congestion control", rec.congestion_control, ""},
  };
  out << AlignColumns(rows, 3);
  return out.str();
}

std::string FormatLinkReportJson(const LinkBenchReport& r) {
  using Json = nlohmann::ordered_json;
  const LinkBenchOptions& o = r.options;
  Json j;
  cli::SetReportHeader(j, kToolName, r.date);
  j["command"] = "link";
  j["cpu"] = r.cpu;
  j["region"] = o.endpoint.region;
  j["peer_region"] = o.endpoint.peer_regions.front();
  j["server"] = Where(o);
  j["transport"] = r.transport;
  j["congestion_control"] = r.congestion_control;
  j["duration_s"] = static_cast<double>(o.duration_ns) * 1e-9;
  j["warmup_s"] = static_cast<double>(r.warmup_ns) * 1e-9;
  j["message_bytes"] = o.message_bytes;
  j["inflight_bytes"] = o.inflight_bytes;
  j["chunk_bytes"] = o.chunk_bytes == 0 ? Json("adaptive") : Json(o.chunk_bytes);
  j["link_rate_bps"] = o.link_rate_bps ? Json(*o.link_rate_bps) : Json(nullptr);
  Json tests = Json::array();
  for (const StreamResult& t : r.tests) {
    tests.push_back(Json{
        {"streams", t.spec.Label()},
        {"streams_end", t.streams_end},
        {"seconds", t.seconds},
        {"bytes_acked", t.bytes_acked},
        {"goodput_bps", t.goodput_bps},
        {"goodput_vs_link",
         o.link_rate_bps ? Json(t.goodput_bps / *o.link_rate_bps) : Json(nullptr)},
        {"rtt_min_ms", static_cast<double>(t.rtt_min_ns) * 1e-6},
        {"rtt_smoothed_ms", static_cast<double>(t.rtt_smoothed_ns) * 1e-6},
        {"tcp_rtt_ms", static_cast<double>(t.tcp_rtt_ns) * 1e-6},
        {"retransmissions", t.retransmissions},
        {"stream_failures", t.stream_failures},
        {"chunk_bytes", t.chunk_bytes},
        {"client_cpu_fraction", t.cpu_fraction},
    });
  }
  j["tests"] = std::move(tests);
  Json codecs = Json::array();
  for (const CodecLinkResult& c : r.codecs) {
    codecs.push_back(Json{{"codec", c.codec},
                          {"lossless", c.lossless},
                          {"ratio", c.ratio},
                          {"encode_bytes_per_s", c.encode_bytes_per_s},
                          {"decode_bytes_per_s", c.decode_bytes_per_s},
                          {"effective_bps", c.effective_bps},
                          {"bottleneck", c.bottleneck}});
  }
  j["codecs"] = std::move(codecs);
  const Recommendation& rec = r.recommended;
  j["recommended"] = Json{{"streams", rec.streams},
                          {"chunk_bytes", rec.chunk_bytes},
                          {"codec", rec.codec},
                          {"congestion_control", rec.congestion_control},
                          {"goodput_bps", rec.goodput_bps},
                          {"effective_bps", rec.effective_bps}};
  return j.dump(2) + "\n";
}

}  // namespace strait::bench
