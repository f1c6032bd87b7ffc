// `strait-bench codec`'s judgement and report: the codec issue's goals checked on the measured
// rows, the table a person reads and the JSON a script keeps. Apart from the measurement
// (codec_bench.cc) so that a change of the report's form or of a goal does not touch the code
// that measures.
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_common.h"
#include "bench/codec_bench.h"
#include "bench/codec_bench_internal.h"
#include "common/units.h"
#include "tools/cli/cli.h"

namespace strait::bench {
namespace {

// Below this share of wall-clock time on the CPU the report warns that the machine was busy.
constexpr double kBusyOnCpu = 0.9;

// Goals from the codec issue, judged on float32 rows at the default settings.
constexpr double kEfEncodeGoal = 0.4;        // x memcpy
constexpr double kDecodeAccGoal = 0.4;       // x memcpy
constexpr double kZstdShuffledGoal = 800e6;  // bytes per second, level 1

std::string Sci(double v) {
  if (v == 0) return "0";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2e", v);
  return buf;
}

std::string GBps(double bytes_per_second) {
  return Fixed(bytes_per_second / 1e9, 2);
}

const CodecBenchRow* FindRow(const CodecBenchReport& r, std::string_view name, DataType dtype) {
  for (const CodecBenchRow& row : r.rows) {
    if (row.name == name && row.dtype == dtype) return &row;
  }
  return nullptr;
}

}  // namespace

namespace codec_bench_internal {

void AddGoals(CodecBenchReport* r) {
  const double memcpy_bps = r->memcpy_speed.best;
  auto vs_memcpy = [&](std::string row_name, std::string name, const std::optional<Speed>& speed,
                       double goal) {
    CodecGoal g;
    g.row = std::move(row_name);
    g.name = std::move(name);
    g.target = ">= " + Fixed(goal, 2) + " x memcpy";
    if (speed && memcpy_bps > 0) {
      const double ratio = speed->best / memcpy_bps;
      g.measured = GBps(speed->best) + " GB/s = " + Fixed(ratio, 2) + " x memcpy";
      g.pass = ratio >= goal;
    }
    return g;
  };
  const DataType f32 = DataType::kFloat32;
  const CodecBenchRow* ef = FindRow(*r, "int8+ef", f32);
  CodecGoal g1 =
      vs_memcpy("int8+ef", "int8+ef encode", ef ? ef->encode : std::nullopt, kEfEncodeGoal);
  const CodecBenchRow* acc = FindRow(*r, "decode-acc", f32);
  CodecGoal g2 = vs_memcpy("decode-acc", "int8 decode-accumulate", acc ? acc->decode : std::nullopt,
                           kDecodeAccGoal);
  CodecGoal g3;
  g3.row = "zstd";
  g3.name = "zstd -1 shuffled encode";
  g3.target = ">= " + Fixed(kZstdShuffledGoal / 1e6, 0) + " MB/s";
  const CodecBenchRow* zstd = FindRow(*r, "zstd", f32);
  if (zstd != nullptr && r->options.zstd_level == 1) {
    g3.measured = Fixed(zstd->encode->best / 1e6, 0) + " MB/s";
    g3.pass = zstd->encode->best >= kZstdShuffledGoal;
  } else if (zstd != nullptr) {
    g3.measured = "not judged: --zstd-level is " + std::to_string(r->options.zstd_level);
  }
  for (CodecGoal* g : {&g1, &g2, &g3}) {
    if (!g->pass && g->measured.empty()) {
      g->measured = "not measured: needs row '" + g->row + "' with dtype float32";
    }
    r->goals.push_back(std::move(*g));
  }
}

}  // namespace codec_bench_internal

namespace {

const CodecGoal* GoalFor(const CodecBenchReport& r, const CodecBenchRow& row) {
  for (const CodecGoal& g : r.goals) {
    if (g.row == row.name && g.dtype == row.dtype && g.pass) return &g;
  }
  return nullptr;
}

const char* PassText(const std::optional<bool>& pass) {
  if (!pass) return "n/a";
  return *pass ? "PASS" : "MISS";
}

const char* RoundingName(Rounding r) {
  return r == Rounding::kNearest ? "nearest" : "stochastic";
}

}  // namespace

std::string FormatCodecReportTable(const CodecBenchReport& r) {
  const CodecBenchOptions& o = r.options;
  const double memcpy_bps = r.memcpy_speed.best;
  std::ostringstream out;
  out << "strait-bench codec: " << FormatBytes(o.size_bytes) << " per row, single thread, best of "
      << o.iters << " after 1 warm-up\n";
  out << AlignColumns(
      {
          {"cpu", r.cpu},
          {"codec isa", r.isa},
          {"date", r.date},
          {"data", "gradient-like, seed " + std::to_string(o.seed) + "; block " +
                       std::to_string(o.block_size) + ", rounding " + RoundingName(o.rounding) +
                       ", zstd level " + std::to_string(o.zstd_level)},
          {"memcpy", GBps(memcpy_bps) + " GB/s (best of " + std::to_string(r.memcpy_runs) + ", " +
                         FormatBytes(o.size_bytes) +
                         "); speeds are GB/s (1e9 B/s) of input "
                         "and (x memcpy)"},
          {"on cpu", Fixed(100 * r.on_cpu, 0) + "% of timed wall-clock time" +
                         (r.on_cpu < kBusyOnCpu ? ": WARNING: the machine was busy, figures "
                                                  "understate the codec"
                                                : "")},
      },
      2);
  out << '\n';

  auto speed = [&](const std::optional<Speed>& s) -> std::string {
    if (!s) return "-";
    return GBps(s->best) + " (" + Fixed(memcpy_bps > 0 ? s->best / memcpy_bps : 0, 2) + "x)";
  };
  auto opt = [](const std::optional<double>& v) { return v ? Sci(*v) : std::string("-"); };
  std::vector<std::vector<std::string>> table = {{"row", "dtype", "ratio", "encode GB/s",
                                                  "decode GB/s", "max abs err", "mean abs err",
                                                  "max err/absmax", "goal"}};
  for (const CodecBenchRow& row : r.rows) {
    const CodecGoal* goal = GoalFor(r, row);
    table.push_back(
        {row.name, DataTypeName(row.dtype),
         row.frame_bytes
             ? Fixed(static_cast<double>(row.input_bytes) / static_cast<double>(*row.frame_bytes),
                     2)
             : "-",
         speed(row.encode), speed(row.decode), opt(row.max_abs_error), opt(row.mean_abs_error),
         opt(row.max_error_vs_absmax), goal ? PassText(goal->pass) : ""});
  }
  out << AlignColumns(table, 2);
  out << "decode column: Decode for codec rows, DecodeAccumulate into fp32 for decode-acc, "
         "ReduceInPlace sum for reduce.\nerrors: against the fp32 source, so bf16/fp16 rows "
         "include the conversion; lossless rows checked bit-exact.\n\n";

  out << "goals (single thread, float32):\n";
  std::vector<std::vector<std::string>> goals;
  for (const CodecGoal& g : r.goals) {
    goals.push_back({"  " + g.name, g.target, g.measured, PassText(g.pass)});
  }
  out << AlignColumns(goals, 4);
  return out.str();
}

std::string FormatCodecReportJson(const CodecBenchReport& r) {
  using Json = nlohmann::ordered_json;
  const double memcpy_bps = r.memcpy_speed.best;
  auto speed = [&](const std::optional<Speed>& s) -> Json {
    if (!s) return nullptr;
    return Json{{"best_gbps", s->best / 1e9},
                {"median_gbps", s->median / 1e9},
                {"best_vs_memcpy", memcpy_bps > 0 ? s->best / memcpy_bps : 0.0}};
  };
  auto opt = [](const auto& v) -> Json {
    if (!v) return nullptr;
    return *v;
  };
  const CodecBenchOptions& o = r.options;
  Json j;
  cli::SetReportHeader(j, kToolName, r.date);
  j["command"] = "codec";
  j["cpu"] = r.cpu;
  j["codec_isa"] = r.isa;
  j["size_bytes"] = o.size_bytes;
  j["iters"] = o.iters;
  j["seed"] = o.seed;
  j["zstd_level"] = o.zstd_level;
  j["block_size"] = o.block_size;
  j["rounding"] = RoundingName(o.rounding);
  j["threads"] = 1;
  j["on_cpu_fraction"] = r.on_cpu;
  j["memcpy"] = Json{{"best_gbps", r.memcpy_speed.best / 1e9},
                     {"median_gbps", r.memcpy_speed.median / 1e9},
                     {"runs", r.memcpy_runs}};
  Json rows = Json::array();
  for (const CodecBenchRow& row : r.rows) {
    Json jr;
    jr["row"] = row.name;
    jr["dtype"] = DataTypeName(row.dtype);
    jr["elements"] = row.elements;
    jr["input_bytes"] = row.input_bytes;
    jr["frame_bytes"] = opt(row.frame_bytes);
    jr["ratio"] =
        row.frame_bytes
            ? Json(static_cast<double>(row.input_bytes) / static_cast<double>(*row.frame_bytes))
            : Json(nullptr);
    jr["encode"] = speed(row.encode);
    jr["decode"] = speed(row.decode);
    jr["lossless"] = row.lossless;
    jr["max_abs_error"] = opt(row.max_abs_error);
    jr["mean_abs_error"] = opt(row.mean_abs_error);
    jr["max_error_vs_absmax"] = opt(row.max_error_vs_absmax);
    rows.push_back(std::move(jr));
  }
  j["rows"] = std::move(rows);
  Json goals = Json::array();
  for (const CodecGoal& g : r.goals) {
    goals.push_back(Json{{"name", g.name},
                         {"row", g.row},
                         {"dtype", DataTypeName(g.dtype)},
                         {"target", g.target},
                         {"measured", g.measured},
                         {"pass", opt(g.pass)}});
  }
  j["goals"] = std::move(goals);
  return j.dump(2) + "\n";
}

}  // namespace strait::bench
