// The metrics registry and its Prometheus text exposition (see metrics.h).
#include "gateway/metrics.h"

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace strait::gateway {
namespace {

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

void AppendLabels(std::string& out, const MetricLabels& labels, const char* extra_name = nullptr,
                  const std::string& extra_value = {}) {
  if (labels.empty() && extra_name == nullptr) return;
  out += '{';
  bool first = true;
  for (const auto& [name, value] : labels) {
    if (!first) out += ',';
    first = false;
    out += name;
    out += "=\"";
    out += EscapeLabelValue(value);
    out += '"';
  }
  if (extra_name != nullptr) {
    if (!first) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
}

// Prometheus attaches `job` and `instance` to every scraped series itself; a series carrying its
// own is renamed to `exported_job` / `exported_instance` on ingestion (honor_labels is off by
// default), so queries written against the documented name silently find nothing.
void CheckLabelNames(const std::string& metric, const MetricLabels& labels) {
  for (const auto& label : labels) {
    if (label.first == "job" || label.first == "instance") {
      throw std::logic_error("metric " + metric + " uses label '" + label.first +
                             "', which Prometheus reserves for the scrape target");
    }
  }
}

void AppendSample(std::string& out, const std::string& name, const MetricLabels& labels,
                  double value, const char* extra_name = nullptr,
                  const std::string& extra_value = {}) {
  out += name;
  AppendLabels(out, labels, extra_name, extra_value);
  out += ' ';
  out += FormatMetricValue(value);
  out += '\n';
}

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (const char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Integral values up to 2^53 print as integers (counters are read by people too).
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), static_cast<int64_t>(value));
    return ec == std::errc() ? std::string(buf, end) : "NaN";
  }
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  return ec == std::errc() ? std::string(buf, end) : "NaN";
}

void MetricsRegistry::Declare(const std::string& name, MetricType type, const std::string& help,
                              std::vector<double> buckets) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    if (it->second.type != type) {
      throw std::logic_error("metric " + name + " declared again with another type");
    }
    return;
  }
  Family& f = families_[name];
  f.type = type;
  f.help = help;
  f.buckets = std::move(buckets);
}

MetricsRegistry::Family& MetricsRegistry::Find(const std::string& name, MetricType a,
                                               MetricType b) {
  auto it = families_.find(name);
  if (it == families_.end()) throw std::logic_error("metric " + name + " is not declared");
  if (it->second.type != a && it->second.type != b) {
    throw std::logic_error(std::string("metric ") + name + " is a " + TypeName(it->second.type));
  }
  return it->second;
}

void MetricsRegistry::Add(const std::string& name, const MetricLabels& labels, double delta) {
  CheckLabelNames(name, labels);
  std::lock_guard<std::mutex> lock(mu_);
  Find(name, MetricType::kCounter, MetricType::kGauge).series[labels].value += delta;
}

void MetricsRegistry::Set(const std::string& name, const MetricLabels& labels, double value) {
  CheckLabelNames(name, labels);
  std::lock_guard<std::mutex> lock(mu_);
  Find(name, MetricType::kCounter, MetricType::kGauge).series[labels].value = value;
}

void MetricsRegistry::Observe(const std::string& name, const MetricLabels& labels, double value) {
  CheckLabelNames(name, labels);
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = Find(name, MetricType::kHistogram, MetricType::kHistogram);
  Series& s = f.series[labels];
  if (s.bucket_counts.size() != f.buckets.size()) s.bucket_counts.assign(f.buckets.size(), 0);
  for (size_t i = 0; i < f.buckets.size(); ++i) {
    if (value <= f.buckets[i]) {
      ++s.bucket_counts[i];
      break;
    }
  }
  ++s.count;
  s.sum += value;
}

void MetricsRegistry::Clear(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it != families_.end()) it->second.series.clear();
}

double MetricsRegistry::Value(const std::string& name, const MetricLabels& labels) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto s = it->second.series.find(labels);
  return s == it->second.series.end() ? 0 : s->second.value;
}

std::string MetricsRegistry::Text() const { return MergedText({{MetricLabels{}, this}}); }

std::string MetricsRegistry::MergedText(
    const std::vector<std::pair<MetricLabels, const MetricsRegistry*>>& parts) {
  // Copies of each part's families (one lock at a time), then one family block per name with
  // every part's series, the part's labels first.
  std::vector<std::map<std::string, Family>> copies;
  copies.reserve(parts.size());
  for (const auto& [prefix, registry] : parts) {
    std::lock_guard<std::mutex> lock(registry->mu_);
    copies.push_back(registry->families_);
  }
  std::map<std::string, std::vector<std::pair<size_t, const Family*>>> by_name;
  for (size_t i = 0; i < copies.size(); ++i) {
    for (const auto& [name, f] : copies[i]) by_name[name].emplace_back(i, &f);
  }
  std::string out;
  for (const auto& [name, members] : by_name) {
    const Family& head = *members.front().second;
    out += "# HELP " + name + " " + EscapeHelp(head.help) + "\n";
    out += "# TYPE " + name + " " + TypeName(head.type) + "\n";
    for (const auto& [part, f] : members) {
      for (const auto& [own_labels, s] : f->series) {
        MetricLabels labels = parts[part].first;
        labels.insert(labels.end(), own_labels.begin(), own_labels.end());
        if (f->type != MetricType::kHistogram) {
          AppendSample(out, name, labels, s.value);
          continue;
        }
        uint64_t cumulative = 0;
        for (size_t i = 0; i < f->buckets.size(); ++i) {
          cumulative += i < s.bucket_counts.size() ? s.bucket_counts[i] : 0;
          AppendSample(out, name + "_bucket", labels, static_cast<double>(cumulative), "le",
                       FormatMetricValue(f->buckets[i]));
        }
        AppendSample(out, name + "_bucket", labels, static_cast<double>(s.count), "le", "+Inf");
        AppendSample(out, name + "_sum", labels, s.sum);
        AppendSample(out, name + "_count", labels, static_cast<double>(s.count));
      }
    }
  }
  return out;
}

}  // namespace strait::gateway
