// Leveled logging shared by every Strait binary and library.
//
// Usage: STRAIT_LOG(kInfo, "codec") << "chose " << name;  The stream is only built when the level
// is enabled. The level comes from STRAIT_LOG_LEVEL (error, warn, info, debug, trace) at first
// use, or from SetLogLevel (tools map their --log-level flag to it). Lines go to stderr as
//   2026-11-29T18:48:58.123Z I codec: chose int8
// or, with the JSON format (SetLogFormat, STRAIT_LOG_FORMAT=json; for log collectors), as one
// JSON object per line:
//   {"ts":"2026-11-29T18:48:58.123Z","level":"info","subsystem":"codec","msg":"chose int8"}
// unless a sink is installed (the NCCL plugin routes lines into NCCL's logger this way).
// Thread-safe: each line is formatted privately and written with one call.
#ifndef STRAIT_LIB_COMMON_LOG_H_
#define STRAIT_LIB_COMMON_LOG_H_

#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "strait/status.h"

namespace strait {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

const char* LogLevelName(LogLevel level) noexcept;  // "error", "warn", ...
// Accepts the names above (any case) and the digits 0-4.
StatusOr<LogLevel> ParseLogLevel(std::string_view text);

LogLevel GetLogLevel() noexcept;
void SetLogLevel(LogLevel level) noexcept;
bool LogEnabled(LogLevel level) noexcept;

// Reads STRAIT_LOG_LEVEL; an invalid value is an error naming the variable and the choices.
// Called lazily by the first log statement (which then warns instead); tools call it at start
// so that a bad value stops them with a clear message.
Status InitLogLevelFromEnv();

// How the stderr writer formats lines: human text (the default) or one JSON object per line.
enum class LogFormat : int { kText = 0, kJson = 1 };
const char* LogFormatName(LogFormat format) noexcept;  // "text", "json"
// Accepts "text" and "json" (any case).
StatusOr<LogFormat> ParseLogFormat(std::string_view text);
LogFormat GetLogFormat() noexcept;
void SetLogFormat(LogFormat format) noexcept;
// Reads STRAIT_LOG_FORMAT (unset or empty: leaves the format alone); an invalid value is an
// error naming the variable and the choices. Tools call it at start.
Status InitLogFormatFromEnv();

// `text` as the contents of a JSON string (without the quotes): escapes quote, backslash and
// control characters; bytes >= 0x80 pass through (messages are UTF-8). Exposed for the tests.
std::string JsonEscape(std::string_view text);
// One log line as the JSON writer prints it (without the trailing newline); `timestamp` is the
// RFC 3339 UTC time. Exposed for the tests.
std::string FormatJsonLogLine(std::string_view timestamp, LogLevel level,
                              std::string_view subsystem, std::string_view message);

// The current time as log lines carry it: RFC 3339 UTC with milliseconds
// ("2026-11-29T18:48:58.123Z"). For tools that print a line of their own in the log's format.
std::string LogTimestampNow();

// Replaces the stderr writer (nullptr restores it). The sink receives one complete line,
// without the trailing newline. It must be thread-safe.
using LogSink = std::function<void(LogLevel level, std::string_view subsystem,
                                   std::string_view message)>;
void SetLogSink(LogSink sink);

// Writes one line; used by the macro.
void LogLine(LogLevel level, std::string_view subsystem, std::string_view message);

namespace log_internal {
class LineBuilder {
 public:
  LineBuilder(LogLevel level, std::string_view subsystem) : level_(level), subsystem_(subsystem) {}
  ~LineBuilder() { LogLine(level_, subsystem_, stream_.str()); }
  LineBuilder(const LineBuilder&) = delete;
  LineBuilder& operator=(const LineBuilder&) = delete;
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::string_view subsystem_;
  std::ostringstream stream_;
};
}  // namespace log_internal

}  // namespace strait

#define STRAIT_LOG(level, subsystem)                            \
  if (!::strait::LogEnabled(::strait::LogLevel::level)) {       \
  } else                                                        \
    ::strait::log_internal::LineBuilder(::strait::LogLevel::level, subsystem).stream()

#endif  // STRAIT_LIB_COMMON_LOG_H_
