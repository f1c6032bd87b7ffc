// What every Strait command-line tool (straitd, strait-bench, strait-wanem, codec_micro) does
// alike, so that operators and scripts meet one convention:
// - `--version` prints "<tool> <version> (git <describe>)" (common/version.h) and exits 0;
// - a bad flag, a missing required flag or an invalid value prints one line on stderr,
//   "<tool>: <what is wrong> (see <tool> --help)", and exits kExitUsage (2);
// - a `--json` report starts with the fields "tool", "version" and "timestamp".
//
// Usage:
//   CLI::App app{"..."};
//   strait::cli::AddVersionFlag(app, "straitd");
//   ... add options ...
//   if (std::optional<int> done = strait::cli::Parse(app, argc, argv, "straitd")) return *done;
#ifndef STRAIT_TOOLS_CLI_CLI_H_
#define STRAIT_TOOLS_CLI_CLI_H_

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/version.h"
#include "tools/cli/cli_fwd.h"

namespace strait::cli {

// Adds `--version` to `app`: prints VersionLine(tool) on stdout and exits 0, before required
// options or subcommands are checked.
void AddVersionFlag(CLI::App& app, std::string_view tool);

// Parses argv with `app`. Returns std::nullopt when the program should go on, or the exit code
// to return now: 0 after --help or --version (printed), kExitUsage after a usage error (printed
// as one line naming the tool).
std::optional<int> Parse(CLI::App& app, int argc, char** argv, std::string_view tool);

// Prints "<tool>: <message> (see <tool> --help)" on stderr and returns kExitUsage, for flag
// values only the program can judge after parsing.
int UsageError(std::string_view tool, std::string_view message);

// A check for a numeric option in [lo, hi] (with `zero_means` non-empty, 0 is also taken and
// the message says what it means): "found 5; give 4096..16777216 elements, or 0 (straitd's
// default)". CLI11's own CLI::Range says "Value 5 not in range [4096 - 16777216]", and joined
// with IsMember for the 0 it printed both clauses.
CLI::Validator NumberIn(double lo, double hi, std::string_view unit,
                        std::string_view zero_means = "");

// "2026-11-29T18:48:58Z": now, UTC, to the second.
std::string UtcTimestamp();

// Sets the fields every --json report carries on `j` (nlohmann::json or ordered_json; call it
// first on an ordered_json so that they lead): "tool", "version" (ProjectVersion()) and
// "timestamp" (when the measurement was made; now by default).
template <typename Json>
void SetReportHeader(Json& j, std::string_view tool,
                     const std::string& timestamp = UtcTimestamp()) {
  j["tool"] = std::string(tool);
  j["version"] = ProjectVersion();
  j["timestamp"] = timestamp;
}

}  // namespace strait::cli

#endif  // STRAIT_TOOLS_CLI_CLI_H_
