// Parsing of link specs, pair selectors and schedule files (formats described in config.h).
#include "bench/wanem/config.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/strings.h"
#include "common/units.h"

namespace strait::wanem {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

std::vector<std::string_view> SplitTokens(std::string_view spec) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < spec.size()) {
    while (i < spec.size() && (spec[i] == ',' || spec[i] == ' ' || spec[i] == '\t')) ++i;
    size_t j = i;
    while (j < spec.size() && spec[j] != ',' && spec[j] != ' ' && spec[j] != '\t') ++j;
    if (j > i) out.push_back(spec.substr(i, j - i));
    i = j;
  }
  return out;
}

StatusOr<double> ParseNumber(std::string_view text) {
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return InvalidArgumentError("'" + std::string(text) + "' is not a number");
  }
  return v;
}

// "1%", "0.01" -> 0.01; must lie in [0, 1].
StatusOr<double> ParseProbability(std::string_view key, std::string_view text) {
  const bool percent = !text.empty() && text.back() == '%';
  auto v = ParseNumber(percent ? text.substr(0, text.size() - 1) : text);
  const std::string what = std::string(key) + "='" + std::string(text) + "'";
  if (!v.ok()) {
    return InvalidArgumentError("bad " + what + ": expected a probability such as 1% or 0.01");
  }
  const double p = percent ? *v / 100.0 : *v;
  if (!(p >= 0.0 && p <= 1.0)) {
    return InvalidArgumentError("bad " + what + ": a probability must lie in [0, 1] (0%-100%)");
  }
  return p;
}

StatusOr<int> ParseRegion(std::string_view text, int regions, std::string_view whole) {
  int v = -1;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || v < 0 || v >= regions) {
    return InvalidArgumentError("bad pair '" + std::string(whole) + "': region '" +
                                std::string(text) + "' is not in 0.." +
                                std::to_string(regions - 1));
  }
  return v;
}

Status Bad(std::string_view key, std::string_view value, const Status& why) {
  return InvalidArgumentError("bad " + std::string(key) + "='" + std::string(value) +
                              "': " + why.message());
}

}  // namespace

StatusOr<LinkParams> ParseLinkSpec(std::string_view spec, const LinkParams& start,
                                   const LinkParams& base) {
  LinkParams p = start;
  for (std::string_view tok : SplitTokens(spec)) {
    const size_t eq = tok.find('=');
    std::string_view key = eq == std::string_view::npos ? std::string_view() : tok.substr(0, eq);
    std::string_view value = eq == std::string_view::npos ? tok : tok.substr(eq + 1);
    if (key.empty()) {
      // Bare tokens: keywords, then a rate or a duration (the one-way delay).
      if (value == "base") {
        p = base;
        continue;
      }
      if (value == "reorder") {
        p.reorder = true;
        continue;
      }
      if (value == "unlimited") {
        p.rate_bps = 0;
        continue;
      }
      if (auto r = ParseRate(value); r.ok()) {
        p.rate_bps = *r;
        continue;
      }
      if (auto d = ParseDurationNanos(value); d.ok()) {
        p.delay_ns = *d;
        continue;
      }
      return InvalidArgumentError(
          "bad link setting '" + std::string(value) +
          "': expected key=value (rate, delay, jitter, loss, ge, queue, flowrate, flowburst, "
          "reorder, syn), a rate such as 100mbit, or a delay such as 25ms");
    }
    if (key == "rate") {
      if (value == "unlimited" || value == "0") {
        p.rate_bps = 0;
      } else if (!value.empty() && value.back() == '%') {
        auto pct = ParseNumber(value.substr(0, value.size() - 1));
        if (!pct.ok() || !(*pct > 0.0) || *pct > 1e6) {
          return InvalidArgumentError("bad rate='" + std::string(value) +
                                      "': a percentage must be a positive number such as 30%");
        }
        if (base.rate_bps == 0) {
          return InvalidArgumentError("bad rate='" + std::string(value) +
                                      "': a percentage needs a base rate, and this pair's is "
                                      "unlimited");
        }
        p.rate_bps = std::max<uint64_t>(1, uint64_t(double(base.rate_bps) * *pct / 100.0));
      } else {
        auto r = ParseRate(value);
        if (!r.ok()) return Bad(key, value, r.status());
        p.rate_bps = *r;
      }
    } else if (key == "delay" || key == "jitter") {
      auto d = ParseDurationNanos(value);
      if (!d.ok()) return Bad(key, value, d.status());
      if (*d < 0) return InvalidArgumentError("bad " + std::string(key) + ": must be >= 0");
      (key == "delay" ? p.delay_ns : p.jitter_ns) = *d;
    } else if (key == "reorder") {
      if (value == "on" || value == "1" || value == "true") {
        p.reorder = true;
      } else if (value == "off" || value == "0" || value == "false") {
        p.reorder = false;
      } else {
        return InvalidArgumentError("bad reorder='" + std::string(value) + "': use on or off");
      }
    } else if (key == "loss") {
      auto v = ParseProbability(key, value);
      if (!v.ok()) return v.status();
      p.loss = *v;
    } else if (key == "ge") {
      if (value == "off" || value == "0") {
        p.ge = GilbertElliottParams();
        continue;
      }
      std::vector<std::string_view> parts;
      size_t i = 0;
      while (true) {
        const size_t c = value.find(':', i);
        parts.push_back(value.substr(i, c == std::string_view::npos ? c : c - i));
        if (c == std::string_view::npos) break;
        i = c + 1;
      }
      if (parts.size() < 2 || parts.size() > 4) {
        return InvalidArgumentError("bad ge='" + std::string(value) +
                                    "': expected P:R[:LOSS_BAD[:LOSS_GOOD]], e.g. ge=1%:30%");
      }
      GilbertElliottParams ge;
      double* fields[4] = {&ge.p, &ge.r, &ge.loss_bad, &ge.loss_good};
      for (size_t k = 0; k < parts.size(); ++k) {
        auto v = ParseProbability("ge", parts[k]);
        if (!v.ok()) return v.status();
        *fields[k] = *v;
      }
      if (ge.p > 0.0 && ge.r <= 0.0) {
        return InvalidArgumentError("bad ge='" + std::string(value) +
                                    "': R must be > 0 or the link never leaves the bad state");
      }
      p.ge = ge;
    } else if (key == "queue") {
      if (value == "bdp" || value == "auto") {
        p.queue_limit_bytes = 0;
      } else {
        auto s = ParseSize(value);
        if (!s.ok()) return Bad(key, value, s.status());
        if (*s < 2048) return InvalidArgumentError("bad queue='" + std::string(value) +
                                                   "': must hold at least 2 KiB");
        p.queue_limit_bytes = *s;
      }
    } else if (key == "flowrate") {
      if (value == "off" || value == "0") {
        p.flow_rate_bps = 0;
      } else {
        auto r = ParseRate(value);
        if (!r.ok()) return Bad(key, value, r.status());
        p.flow_rate_bps = *r;
      }
    } else if (key == "flowburst") {
      auto s = ParseSize(value);
      if (!s.ok()) return Bad(key, value, s.status());
      p.flow_burst_bytes = *s;
    } else if (key == "syn") {
      if (value == "drop") {
        p.drop_syn = true;
      } else if (value == "pass") {
        p.drop_syn = false;
      } else {
        return InvalidArgumentError("bad syn='" + std::string(value) +
                                    "': use drop (the destination admits no inbound TCP "
                                    "connection from the source) or pass");
      }
    } else {
      return InvalidArgumentError("unknown link setting '" + std::string(key) +
                                  "': expected rate, delay, jitter, reorder, loss, ge, queue, "
                                  "flowrate, flowburst or syn");
    }
  }
  return p;
}

StatusOr<std::vector<std::pair<int, int>>> ParsePairSelector(std::string_view text, int regions) {
  std::vector<std::pair<int, int>> out;
  if (text == "*") {
    for (int i = 0; i < regions; ++i) {
      for (int j = 0; j < regions; ++j) {
        if (i != j) out.emplace_back(i, j);
      }
    }
    return out;
  }
  const size_t sep = text.find_first_of(":>");
  if (sep == std::string_view::npos) {
    return InvalidArgumentError("bad pair '" + std::string(text) +
                                "': expected i:j (both directions), i>j (one direction), *>j "
                                "(every link into j), i>* (every link out of i) or *");
  }
  // Every link into (or out of) one region: "*>2=syn=drop" puts region 2 behind NAT.
  if (text[sep] == '>' && (text.substr(0, sep) == "*" || text.substr(sep + 1) == "*")) {
    const bool into = text.substr(0, sep) == "*";
    if (into && text.substr(sep + 1) == "*") {
      return InvalidArgumentError("bad pair '" + std::string(text) + "': use * for every pair");
    }
    STRAIT_ASSIGN_OR_RETURN(
        int k, ParseRegion(into ? text.substr(sep + 1) : text.substr(0, sep), regions, text));
    for (int i = 0; i < regions; ++i) {
      if (i != k) out.emplace_back(into ? i : k, into ? k : i);
    }
    return out;
  }
  STRAIT_ASSIGN_OR_RETURN(int a, ParseRegion(text.substr(0, sep), regions, text));
  STRAIT_ASSIGN_OR_RETURN(int b, ParseRegion(text.substr(sep + 1), regions, text));
  if (a == b) {
    return InvalidArgumentError("bad pair '" + std::string(text) + "': a region has no link to "
                                "itself");
  }
  out.emplace_back(a, b);
  if (text[sep] == ':') out.emplace_back(b, a);
  return out;
}

StatusOr<LinkTable> BuildLinkTable(int regions, std::string_view link,
                                   const std::vector<std::string>& pair_overrides) {
  if (regions < 2 || regions > kMaxRegions) {
    return InvalidArgumentError("bad --regions " + std::to_string(regions) + ": must be 2.." +
                                std::to_string(kMaxRegions));
  }
  auto base = ParseLinkSpec(link, LinkParams(), LinkParams());
  if (!base.ok()) return base.status().WithContext("--link '" + std::string(link) + "'");
  LinkTable t;
  t.regions = regions;
  t.params.assign(regions, std::vector<LinkParams>(regions, *base));
  for (const std::string& o : pair_overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos) {
      return InvalidArgumentError("bad --pair '" + o + "': expected SELECTOR=SPEC, e.g. "
                                  "0:1=rate=20mbit,delay=80ms");
    }
    auto pairs = ParsePairSelector(o.substr(0, eq), regions);
    if (!pairs.ok()) return pairs.status().WithContext("--pair '" + o + "'");
    for (auto [a, b] : *pairs) {
      auto p = ParseLinkSpec(o.substr(eq + 1), t.at(a, b), *base);
      if (!p.ok()) return p.status().WithContext("--pair '" + o + "'");
      t.at(a, b) = *p;
    }
  }
  return t;
}

StatusOr<std::vector<ScheduleEvent>> ParseSchedule(std::string_view text, const LinkTable& base,
                                                   std::string_view origin) {
  struct Raw {
    int64_t at_ns;
    int line;
    std::vector<std::pair<int, int>> pairs;
    std::string spec;
  };
  std::vector<Raw> raws;
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) {
      line = line.substr(0, hash);
    }
    line = Trim(line);
    if (line.empty()) continue;
    const std::string where = std::string(origin) + ":" + std::to_string(line_no);
    // Settings are printable ASCII. Anything else (most often a binary file passed as
    // --schedule) is refused here, shown quoted: echoed raw in the errors below, its bytes would
    // garble the terminal and break the message over several lines.
    if (std::any_of(line.begin(), line.end(), [](char ch) {
          const auto u = static_cast<unsigned char>(ch);
          return (u < 0x20 && u != '\t') || u >= 0x7f;
        })) {
      return InvalidArgumentError(where + ": not a schedule line, it holds bytes that are not "
                                  "printable ASCII: " + QuotedForError(line) +
                                  "; a schedule is a text file of '<time> <pair> <settings>' "
                                  "lines (see bench/README.md)");
    }
    auto fields = SplitTokens(line);
    if (fields.size() < 3) {
      return InvalidArgumentError(where + ": expected '<time> <pair> <settings>', e.g. "
                                  "'20s * rate=30%', got " + QuotedForError(line));
    }
    auto at = ParseDurationNanos(fields[0]);
    if (!at.ok()) {
      return at.status().WithContext(where + ": bad time " + QuotedForError(fields[0]));
    }
    if (*at < 0) return InvalidArgumentError(where + ": time must be >= 0");
    auto pairs = ParsePairSelector(fields[1], base.regions);
    if (!pairs.ok()) return pairs.status().WithContext(where);
    const size_t spec_start = static_cast<size_t>(fields[2].data() - line.data());
    raws.push_back(Raw{*at, line_no, std::move(*pairs), std::string(line.substr(spec_start))});
  }
  std::stable_sort(raws.begin(), raws.end(),
                   [](const Raw& a, const Raw& b) { return a.at_ns < b.at_ns; });
  LinkTable cur = base;
  std::vector<ScheduleEvent> events;
  for (const Raw& r : raws) {
    for (auto [a, b] : r.pairs) {
      auto p = ParseLinkSpec(r.spec, cur.at(a, b), base.at(a, b));
      if (!p.ok()) {
        return p.status().WithContext(std::string(origin) + ":" + std::to_string(r.line));
      }
      cur.at(a, b) = *p;
      events.push_back(ScheduleEvent{r.at_ns, a, b, *p});
    }
  }
  return events;
}

StatusOr<std::vector<ScheduleEvent>> LoadScheduleFile(const std::string& path,
                                                      const LinkTable& base) {
  std::ifstream in(path);
  // A path given on the command line that cannot be read is the user's to fix, like a bad
  // flag: InvalidArgument, so the tool exits 2 (usage) rather than 1 (a failed emulation).
  if (!in) {
    return InvalidArgumentError("cannot open schedule file " + QuotedForError(path) + ": " +
                                std::strerror(errno) +
                                "; give --schedule a readable file (format: bench/README.md)");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ParseSchedule(ss.str(), base, path);
}

namespace {

bool InList(std::string_view list, std::string_view name) {
  const std::vector<std::string_view> names = SplitTokens(list);
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

Status CheckCongestionControl(std::string_view cc, std::string_view available,
                              std::string_view allowed) {
  if (cc.empty() || cc.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") !=
                        std::string_view::npos) {
    return InvalidArgumentError("bad --cc " + QuotedForError(cc) +
                                ": a congestion control is a lower-case name; a region can "
                                "use '" + std::string(Trim(allowed)) + "'");
  }
  if (InList(allowed, cc)) return Status::Ok();
  if (!InList(available, cc)) {
    return InvalidArgumentError("bad --cc '" + std::string(cc) +
                                "': this kernel has no such congestion control; a region can "
                                "use '" + std::string(Trim(allowed)) +
                                "' (net.ipv4.tcp_allowed_congestion_control; loaded: '" +
                                std::string(Trim(available)) + "')");
  }
  // Loaded but restricted: only the root namespace may default to it, and strait-wanem does not
  // change the root namespace.
  return InvalidArgumentError(
      "bad --cc '" + std::string(cc) + "': a region may only default to an algorithm in "
      "net.ipv4.tcp_allowed_congestion_control ('" + std::string(Trim(allowed)) +
      "'); add it there yourself, or pick one of those (programs can still choose it per socket "
      "with TCP_CONGESTION)");
}

}  // namespace strait::wanem
