// Tests of the metrics registry and its Prometheus text exposition: exact text for a small
// registry, label and HELP escaping, value formatting, histogram buckets, misuse.
#include "gateway/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace strait::gateway {
namespace {

TEST(Metrics, ExactTextForASmallRegistry) {
  MetricsRegistry r;
  r.Declare("strait_requests_total", MetricType::kCounter, "Requests served.");
  r.Declare("strait_peer_up", MetricType::kGauge, "1 when the link is up.");
  r.Declare("strait_latency_seconds", MetricType::kHistogram, "Latency.", {0.1, 1});
  r.Add("strait_requests_total", {{"kind", "bad"}}, 2);
  r.Add("strait_requests_total", {{"kind", "bad"}}, 1);
  r.Add("strait_requests_total", {{"kind", "abort"}}, 1);
  r.Set("strait_peer_up", {{"peer", "eu"}}, 1);
  r.Set("strait_peer_up", {{"peer", "ap"}}, 0);
  r.Observe("strait_latency_seconds", {{"strait_job", "j"}}, 0.0625);
  r.Observe("strait_latency_seconds", {{"strait_job", "j"}}, 0.5);
  r.Observe("strait_latency_seconds", {{"strait_job", "j"}}, 3);
  EXPECT_EQ(r.Text(),
            "# HELP strait_latency_seconds Latency.\n"
            "# TYPE strait_latency_seconds histogram\n"
            "strait_latency_seconds_bucket{strait_job=\"j\",le=\"0.1\"} 1\n"
            "strait_latency_seconds_bucket{strait_job=\"j\",le=\"1\"} 2\n"
            "strait_latency_seconds_bucket{strait_job=\"j\",le=\"+Inf\"} 3\n"
            "strait_latency_seconds_sum{strait_job=\"j\"} 3.5625\n"
            "strait_latency_seconds_count{strait_job=\"j\"} 3\n"
            "# HELP strait_peer_up 1 when the link is up.\n"
            "# TYPE strait_peer_up gauge\n"
            "strait_peer_up{peer=\"ap\"} 0\n"
            "strait_peer_up{peer=\"eu\"} 1\n"
            "# HELP strait_requests_total Requests served.\n"
            "# TYPE strait_requests_total counter\n"
            "strait_requests_total{kind=\"abort\"} 1\n"
            "strait_requests_total{kind=\"bad\"} 3\n");
  EXPECT_EQ(r.Value("strait_requests_total", {{"kind", "bad"}}), 3);
}

TEST(Metrics, SeriesWithoutLabelsAndClear) {
  MetricsRegistry r;
  r.Declare("strait_x", MetricType::kGauge, "X.");
  r.Set("strait_x", {}, 1.5);
  EXPECT_EQ(r.Text(), "# HELP strait_x X.\n# TYPE strait_x gauge\nstrait_x 1.5\n");
  r.Clear("strait_x");
  EXPECT_EQ(r.Text(), "# HELP strait_x X.\n# TYPE strait_x gauge\n");
}

TEST(Metrics, LabelValuesAndHelpAreEscaped) {
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(EscapeLabelValue("a\"b"), "a\\\"b");
  EXPECT_EQ(EscapeLabelValue("a\\b"), "a\\\\b");
  EXPECT_EQ(EscapeLabelValue("a\nb"), "a\\nb");
  EXPECT_EQ(EscapeHelp("line \"one\"\nback\\slash"), "line \"one\"\\nback\\\\slash");
  MetricsRegistry r;
  r.Declare("strait_y_total", MetricType::kCounter, "Y.");
  r.Add("strait_y_total", {{"strait_job", "we\"ird\\job\n"}}, 1);
  EXPECT_NE(r.Text().find("strait_y_total{strait_job=\"we\\\"ird\\\\job\\n\"} 1\n"),
            std::string::npos)
      << r.Text();
}

TEST(Metrics, ValuesFormat) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(12345678901), "12345678901");
  EXPECT_EQ(FormatMetricValue(-3), "-3");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(2.5e-7), "2.5e-07");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
}

TEST(Metrics, MisuseIsAProgrammerError) {
  MetricsRegistry r;
  r.Declare("strait_c_total", MetricType::kCounter, "C.");
  EXPECT_THROW(r.Observe("strait_c_total", {}, 1), std::logic_error);
  EXPECT_THROW(r.Add("strait_undeclared", {}, 1), std::logic_error);
  EXPECT_THROW(r.Declare("strait_c_total", MetricType::kGauge, "C."), std::logic_error);
  r.Declare("strait_c_total", MetricType::kCounter, "C.");  // same type: fine
}

// Prometheus renames a series' own `job` / `instance` to `exported_job` / `exported_instance`,
// so dashboards written against the documented name would find nothing (issue 17).
TEST(Metrics, PrometheusTargetLabelNamesAreRefused) {
  MetricsRegistry r;
  r.Declare("strait_c_total", MetricType::kCounter, "C.");
  r.Declare("strait_h_seconds", MetricType::kHistogram, "H.", {1});
  EXPECT_THROW(r.Add("strait_c_total", {{"job", "j"}}, 1), std::logic_error);
  EXPECT_THROW(r.Set("strait_c_total", {{"code", "x"}, {"instance", "i"}}, 1), std::logic_error);
  EXPECT_THROW(r.Observe("strait_h_seconds", {{"job", "j"}}, 1), std::logic_error);
  r.Add("strait_c_total", {{"strait_job", "j"}}, 1);
  EXPECT_EQ(r.Value("strait_c_total", {{"strait_job", "j"}}), 1);
}

}  // namespace
}  // namespace strait::gateway
