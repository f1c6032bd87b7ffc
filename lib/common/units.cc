// Size, rate and duration parsing and formatting (see units.h for the accepted forms).
#include "common/units.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace strait {
namespace {

struct Unit {
  const char* name;
  double factor;
};

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// Splits "  12.5 MiB " into 12.5 and "mib". Fails on an empty or malformed number.
Status SplitNumber(std::string_view text, const char* what, const char* accepted, double* number,
                   std::string* unit) {
  auto fail = [&](const std::string& why) {
    return InvalidArgumentError(std::string("invalid ") + what + " '" + std::string(text) +
                                "': " + why + "; expected " + accepted);
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t start = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == start) return fail("no number");
  const std::string num(text.substr(start, i - start));
  char* end = nullptr;
  *number = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(*number)) return fail("malformed number");
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t unit_end = text.size();
  while (unit_end > i && std::isspace(static_cast<unsigned char>(text[unit_end - 1]))) --unit_end;
  *unit = Lower(text.substr(i, unit_end - i));
  return Status::Ok();
}

template <size_t N>
const Unit* FindUnit(const Unit (&units)[N], const std::string& unit) {
  for (const Unit& u : units) {
    if (unit == u.name) return &u;
  }
  return nullptr;
}

StatusOr<double> Scale(std::string_view text, const char* what, const char* accepted,
                       double number, const Unit* unit, double max) {
  if (unit == nullptr) {
    return InvalidArgumentError(std::string("invalid ") + what + " '" + std::string(text) +
                                "': unknown unit; expected " + accepted);
  }
  const double value = number * unit->factor;
  if (!(value <= max)) {
    return InvalidArgumentError(std::string("invalid ") + what + " '" + std::string(text) +
                                "': too large");
  }
  return value;
}

std::string Printf3(double value, const char* unit) {
  char buf[48];
  if (value >= 100 || value == std::floor(value)) {
    std::snprintf(buf, sizeof(buf), "%.0f %s", value, unit);
  } else if (value >= 10) {
    std::snprintf(buf, sizeof(buf), "%.1f %s", value, unit);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", value, unit);
  }
  return buf;
}

}  // namespace

StatusOr<uint64_t> ParseSize(std::string_view text) {
  static constexpr char kAccepted[] =
      "a number with B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) or KB, MB, GB, TB (powers "
      "of 1000), e.g. 64MiB";
  static constexpr Unit kUnits[] = {
      {"", 1},          {"b", 1},          {"k", 0x1p10},     {"kib", 0x1p10}, {"m", 0x1p20},
      {"mib", 0x1p20},  {"g", 0x1p30},     {"gib", 0x1p30},   {"t", 0x1p40},   {"tib", 0x1p40},
      {"kb", 1e3},      {"mb", 1e6},       {"gb", 1e9},       {"tb", 1e12},
  };
  double number = 0;
  std::string unit;
  STRAIT_RETURN_IF_ERROR(SplitNumber(text, "size", kAccepted, &number, &unit));
  STRAIT_ASSIGN_OR_RETURN(double bytes,
                          Scale(text, "size", kAccepted, number, FindUnit(kUnits, unit), 0x1p62));
  if (bytes != std::floor(bytes)) {
    return InvalidArgumentError("invalid size '" + std::string(text) +
                                "': not a whole number of bytes");
  }
  return static_cast<uint64_t>(bytes);
}

StatusOr<uint64_t> ParseRate(std::string_view text) {
  static constexpr char kAccepted[] =
      "a number with bit, kbit, mbit, gbit, tbit (bits per second) or B/s, KB/s, MB/s, GB/s, "
      "KiB/s, MiB/s, GiB/s (bytes per second), e.g. 100mbit";
  static constexpr Unit kUnits[] = {
      {"bit", 1},        {"kbit", 1e3},      {"mbit", 1e6},       {"gbit", 1e9},
      {"tbit", 1e12},    {"b/s", 8},         {"kb/s", 8e3},       {"mb/s", 8e6},
      {"gb/s", 8e9},     {"kib/s", 8 * 0x1p10}, {"mib/s", 8 * 0x1p20}, {"gib/s", 8 * 0x1p30},
  };
  double number = 0;
  std::string unit;
  STRAIT_RETURN_IF_ERROR(SplitNumber(text, "rate", kAccepted, &number, &unit));
  if (unit.size() >= 3 && unit.compare(unit.size() - 3, 3, "bps") == 0) {
    return InvalidArgumentError("invalid rate '" + std::string(text) + "': '" + unit +
                                "' is ambiguous (tc reads it as bytes, most people as bits); "
                                "write e.g. 100mbit for megabits or 12.5MB/s for megabytes per "
                                "second");
  }
  if (unit.empty()) {
    return InvalidArgumentError("invalid rate '" + std::string(text) + "': missing unit; expected " +
                                kAccepted);
  }
  STRAIT_ASSIGN_OR_RETURN(double bits,
                          Scale(text, "rate", kAccepted, number, FindUnit(kUnits, unit), 0x1p62));
  if (bits < 1) {
    return InvalidArgumentError("invalid rate '" + std::string(text) + "': must be at least 1bit");
  }
  return static_cast<uint64_t>(std::llround(bits));
}

StatusOr<int64_t> ParseDurationNanos(std::string_view text) {
  static constexpr char kAccepted[] = "a number with ns, us, ms, s, m or h, e.g. 20ms";
  static constexpr Unit kUnits[] = {
      {"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}, {"m", 60e9}, {"min", 60e9}, {"h", 3600e9},
  };
  double number = 0;
  std::string unit;
  STRAIT_RETURN_IF_ERROR(SplitNumber(text, "duration", kAccepted, &number, &unit));
  if (unit.empty()) {
    return InvalidArgumentError("invalid duration '" + std::string(text) +
                                "': missing unit; expected " + kAccepted);
  }
  STRAIT_ASSIGN_OR_RETURN(double ns, Scale(text, "duration", kAccepted, number,
                                           FindUnit(kUnits, unit), 0x1p62));
  return static_cast<int64_t>(std::llround(ns));
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int i = 0;
  while (value >= 1024 && i < 5) {
    value /= 1024;
    ++i;
  }
  return Printf3(value, kNames[i]);
}

std::string FormatRate(double bits_per_second) {
  static constexpr const char* kNames[] = {"bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"};
  double value = bits_per_second;
  int i = 0;
  while (value >= 1000 && i < 4) {
    value /= 1000;
    ++i;
  }
  return Printf3(value, kNames[i]);
}

std::string FormatDuration(int64_t nanos) {
  const double v = static_cast<double>(nanos);
  if (nanos < 1'000) return Printf3(v, "ns");
  if (nanos < 1'000'000) return Printf3(v / 1e3, "us");
  if (nanos < 1'000'000'000) return Printf3(v / 1e6, "ms");
  return Printf3(v / 1e9, "s");
}

}  // namespace strait
