// Prometheus metrics for straitd: a small registry of metric families (counters, gauges,
// histograms with labels) and its text exposition format (version 0.0.4), which the /metrics
// endpoint (http.h) serves. See https://prometheus.io/docs/instrumenting/exposition_formats/.
//
// Usage:
//   MetricsRegistry r;
//   r.Declare("strait_allreduce_seconds", MetricType::kHistogram, "...", kLatencyBuckets);
//   r.Observe("strait_allreduce_seconds", {{"strait_job", "llm"}}, 0.012);
//   r.Declare("strait_peer_up", MetricType::kGauge, "...");
//   r.Set("strait_peer_up", {{"peer", "eu"}}, 1);
//   std::string text = r.Text();
//
// Values that live elsewhere (link estimates, the gateway's atomic counters) are copied in just
// before a scrape with Set; series that may vanish (a peer removed) are dropped with Clear.
// Names follow Prometheus conventions: strait_ prefix, _total for counters, base units
// (_seconds, _bytes). Using an undeclared name, or a name with another type, or the label names
// `job` or `instance` (Prometheus' own target labels) is a programmer error (std::logic_error).
// Thread-safe: every method takes one mutex.
#ifndef STRAIT_LIB_GATEWAY_METRICS_H_
#define STRAIT_LIB_GATEWAY_METRICS_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strait::gateway {

enum class MetricType : int { kCounter = 0, kGauge = 1, kHistogram = 2 };

// Label name/value pairs; the order given is the order printed.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Upper bounds for all-reduce latencies in seconds: 1 ms (a small tensor on a LAN) to 2 min
// (a large one over a slow WAN link, near the default deadline).
inline const std::vector<double> kLatencyBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};

class MetricsRegistry {
 public:
  // Declares a family; declaring it again with the same type is a no-op. `buckets` (ascending
  // upper bounds, +Inf implied) only for histograms.
  void Declare(const std::string& name, MetricType type, const std::string& help,
               std::vector<double> buckets = {});
  // Adds `delta` to a counter or gauge series (created at 0).
  void Add(const std::string& name, const MetricLabels& labels, double delta);
  // Sets a counter or gauge series (for counters mirrored from counters kept elsewhere).
  void Set(const std::string& name, const MetricLabels& labels, double value);
  // Records one observation in a histogram series.
  void Observe(const std::string& name, const MetricLabels& labels, double value);
  // Drops every series of a family (its HELP and TYPE still print).
  void Clear(const std::string& name);
  // The current value of a counter or gauge series; 0 if it has none (for tests).
  double Value(const std::string& name, const MetricLabels& labels) const;

  // The text exposition: families in name order, each with HELP and TYPE, series in label order.
  std::string Text() const;
  // One exposition of several registries (a multi-shard straitd's shards): each family once,
  // with every part's series, the part's labels (e.g. {{"shard", "2"}}) before the series' own.
  // The parts must declare a family alike (the first one's HELP and TYPE print).
  static std::string MergedText(
      const std::vector<std::pair<MetricLabels, const MetricsRegistry*>>& parts);

 private:
  struct Series {
    double value = 0;
    std::vector<uint64_t> bucket_counts;  // histograms: per bucket (not cumulative)
    uint64_t count = 0;
    double sum = 0;
  };
  struct Family {
    MetricType type = MetricType::kCounter;
    std::string help;
    std::vector<double> buckets;
    std::map<MetricLabels, Series> series;
  };
  Family& Find(const std::string& name, MetricType a, MetricType b);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
};

// A label value as the exposition format writes it between quotes: \ " and newline escaped.
std::string EscapeLabelValue(std::string_view value);
// HELP text: \ and newline escaped.
std::string EscapeHelp(std::string_view help);
// A sample value: integers without exponent or fraction, others in the shortest form that
// reads back exactly; +Inf, -Inf, NaN.
std::string FormatMetricValue(double value);

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_METRICS_H_
