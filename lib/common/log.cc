// Logging implementation: level state, the env variable, the default stderr writer.
#include "common/log.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

namespace strait {
namespace {

std::atomic<int> g_level{-1};  // -1: not yet read from the environment
std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};
std::mutex g_sink_mu;
LogSink& Sink() {
  static LogSink* sink = new LogSink();  // never destroyed: logging may run during exit
  return *sink;
}

void EnsureLevel() {
  if (g_level.load(std::memory_order_acquire) >= 0) return;
  Status s = InitLogLevelFromEnv();
  if (!s.ok()) {
    g_level.store(static_cast<int>(LogLevel::kInfo), std::memory_order_release);
    LogLine(LogLevel::kWarn, "log", s.message() + "; using 'info'");
  }
}

char LevelLetter(LogLevel level) {
  static constexpr char kLetters[] = {'E', 'W', 'I', 'D', 'T'};
  return kLetters[static_cast<int>(level)];
}

}  // namespace

const char* LogLevelName(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::kError: return "error";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kTrace: return "trace";
  }
  return "invalid";
}

StatusOr<LogLevel> ParseLogLevel(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "warning") t = "warn";
  for (int i = 0; i <= static_cast<int>(LogLevel::kTrace); ++i) {
    const auto level = static_cast<LogLevel>(i);
    if (t == LogLevelName(level) || t == std::to_string(i)) return level;
  }
  return InvalidArgumentError("log level '" + std::string(text) +
                              "' is not one of error, warn, info, debug, trace (or 0-4)");
}

Status InitLogLevelFromEnv() {
  const char* env = std::getenv("STRAIT_LOG_LEVEL");
  if (env == nullptr || *env == '\0') {
    int expected = -1;
    g_level.compare_exchange_strong(expected, static_cast<int>(LogLevel::kInfo));
    return Status::Ok();
  }
  StatusOr<LogLevel> level = ParseLogLevel(env);
  if (!level.ok()) return level.status().WithContext("STRAIT_LOG_LEVEL");
  g_level.store(static_cast<int>(*level), std::memory_order_release);
  return Status::Ok();
}

LogLevel GetLogLevel() noexcept {
  EnsureLevel();
  return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed));
}

void SetLogLevel(LogLevel level) noexcept {
  g_level.store(static_cast<int>(level), std::memory_order_release);
}

bool LogEnabled(LogLevel level) noexcept {
  int current = g_level.load(std::memory_order_relaxed);
  if (current < 0) {
    EnsureLevel();
    current = g_level.load(std::memory_order_relaxed);
  }
  return static_cast<int>(level) <= current;
}

const char* LogFormatName(LogFormat format) noexcept {
  return format == LogFormat::kJson ? "json" : "text";
}

StatusOr<LogFormat> ParseLogFormat(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "text") return LogFormat::kText;
  if (t == "json") return LogFormat::kJson;
  return InvalidArgumentError("log format '" + std::string(text) + "' is not one of text, json");
}

LogFormat GetLogFormat() noexcept {
  return static_cast<LogFormat>(g_format.load(std::memory_order_relaxed));
}

void SetLogFormat(LogFormat format) noexcept {
  g_format.store(static_cast<int>(format), std::memory_order_relaxed);
}

Status InitLogFormatFromEnv() {
  const char* env = std::getenv("STRAIT_LOG_FORMAT");
  if (env == nullptr || *env == '\0') return Status::Ok();
  StatusOr<LogFormat> format = ParseLogFormat(env);
  if (!format.ok()) return format.status().WithContext("STRAIT_LOG_FORMAT");
  SetLogFormat(*format);
  return Status::Ok();
}

std::string JsonEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c) & 0xffu);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string FormatJsonLogLine(std::string_view timestamp, LogLevel level,
                              std::string_view subsystem, std::string_view message) {
  std::string line;
  line.reserve(64 + subsystem.size() + message.size());
  line += "{\"ts\":\"";
  line += JsonEscape(timestamp);
  line += "\",\"level\":\"";
  line += LogLevelName(level);
  line += "\",\"subsystem\":\"";
  line += JsonEscape(subsystem);
  line += "\",\"msg\":\"";
  line += JsonEscape(message);
  line += "\"}";
  return line;
}

std::string LogTimestampNow() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[40];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
  char frac[8];
  std::snprintf(frac, sizeof(frac), ".%03dZ", static_cast<int>(millis));
  return std::string(stamp) + frac;
}

void SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(g_sink_mu);
  Sink() = std::move(sink);
}

void LogLine(LogLevel level, std::string_view subsystem, std::string_view message) {
  {
    std::lock_guard<std::mutex> lock(g_sink_mu);
    if (Sink()) {
      Sink()(level, subsystem, message);
      return;
    }
  }
  const std::string stamp = LogTimestampNow();
  std::string line;
  if (GetLogFormat() == LogFormat::kJson) {
    line = FormatJsonLogLine(stamp, level, subsystem, message);
    line += '\n';
    ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
    return;
  }
  line.reserve(48 + subsystem.size() + message.size());
  line += stamp;
  line += ' ';
  line += LevelLetter(level);
  line += ' ';
  line += subsystem;
  line += ": ";
  line += message;
  line += '\n';
  // One write() per line keeps lines from different threads and processes whole.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace strait
