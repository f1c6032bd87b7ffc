// Shared strait-bench plumbing: validators, machine description, progress line, buffers.
#include "bench/bench_common.h"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <new>

#include "common/units.h"
#include "tools/cli/cli.h"

namespace strait::bench {

int UsageError(std::string_view command, std::string_view flag, std::string_view message) {
  std::cerr << "strait-bench";
  if (!command.empty()) std::cerr << ' ' << command;
  std::cerr << ": " << flag << ": " << message << '\n';
  return kExitUsage;
}

CLI::Validator SizeValidator(uint64_t min_bytes, uint64_t max_bytes) {
  const std::string allowed = "a size from " + std::to_string(min_bytes) + " bytes to " +
                              FormatBytes(max_bytes) + " (e.g. 4096, 64KiB, 16MiB, 1M)";
  return CLI::Validator(
      [min_bytes, max_bytes, allowed](std::string& text) -> std::string {
        StatusOr<uint64_t> bytes = ParseSize(text);
        if (!bytes.ok()) return "expected " + allowed + ": " + bytes.status().message();
        if (*bytes < min_bytes || *bytes > max_bytes) {
          return "expected " + allowed + ", got '" + text + "'";
        }
        text = std::to_string(*bytes);
        return std::string();
      },
      "");
}

namespace {

// An integer of type T in [min, max], written in decimal with nothing around it.
template <typename T>
CLI::Validator RangeValidator(T min, T max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        T v = 0;
        const char* end = text.data() + text.size();
        auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end || v < min || v > max) {
          return "expected an integer from " + std::to_string(min) + " to " + std::to_string(max) +
                 ", got '" + text + "'";
        }
        return std::string();
      },
      "");
}

}  // namespace

CLI::Validator IntValidator(int64_t min, int64_t max) { return RangeValidator(min, max); }

CLI::Validator UintValidator(uint64_t min, uint64_t max) { return RangeValidator(min, max); }

std::vector<std::string> SplitList(std::string_view text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(pos, comma - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    pos = comma + 1;
  }
  return out;
}

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string AlignColumns(const std::vector<std::vector<std::string>>& rows, size_t left) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    if (width.size() < r.size()) width.resize(r.size(), 0);
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      if (c > 0) line += "  ";
      const std::string pad(width[c] - r[c].size(), ' ');
      line += c < left ? r[c] + pad : pad + r[c];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  }
  return out;
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    // x86 says "model name", some arm64 kernels only "Model" or "Processor".
    if (line.rfind("model name", 0) == 0 || line.rfind("Model", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      size_t start = line.find_first_not_of(" \t", colon + 1);
      if (start == std::string::npos) continue;
      return line.substr(start);
    }
  }
  return "unknown";
}

std::string UtcTimestamp() {
  return cli::UtcTimestamp();
}

ProgressLine::ProgressLine() : enabled_(isatty(STDERR_FILENO) == 1) {}

ProgressLine::~ProgressLine() {
  Clear();
}

void ProgressLine::Update(std::string_view text) {
  if (!enabled_) return;
  std::string line(text);
  // Pad with spaces so that a shorter line fully covers the previous one.
  const size_t width = line.size();
  if (width < last_width_) line.append(last_width_ - width, ' ');
  std::fprintf(stderr, "\r%s", line.c_str());
  std::fflush(stderr);
  last_width_ = width;
}

void ProgressLine::Clear() {
  if (!enabled_ || last_width_ == 0) return;
  std::fprintf(stderr, "\r%*s\r", static_cast<int>(last_width_), "");
  std::fflush(stderr);
  last_width_ = 0;
}

void AlignedBuffer::Free::operator()(uint8_t* p) const {
  std::free(p);
}

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes) {
  // aligned_alloc wants a multiple of the alignment; allocate at least one line so that data()
  // is never null.
  const size_t rounded = (bytes + 63) / 64 * 64 + 64;
  data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, rounded)));
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_.get(), 0, rounded);
}

}  // namespace strait::bench
