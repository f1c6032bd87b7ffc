// The tools' shared command-line conventions (see cli.h).
#include "tools/cli/cli.h"

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <string>
#include <vector>

namespace strait::cli {

void AddVersionFlag(CLI::App& app, std::string_view tool) {
  app.set_version_flag("--version", VersionLine(tool), "Print the tool's name and version");
}

std::optional<int> Parse(CLI::App& app, int argc, char** argv, std::string_view tool) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version: CLI11 prints them and gives 0.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    // Every other parse error is a usage error, whatever CLI11's own code for it (105-114).
    std::string what = e.what();
    // With a required subcommand, CLI11 reports "A subcommand is required" for `tool --typo`:
    // name what it did not understand instead.
    const std::vector<std::string> extra = app.remaining();
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && !extra.empty()) {
      const bool is_flag = extra.front().rfind('-', 0) == 0;
      what = std::string("unknown ") + (is_flag ? "option" : "subcommand") + " '" +
             extra.front() + "'";
    }
    // Some CLI11 messages start with the program's name already.
    const std::string prefix = std::string(tool) + ": ";
    if (what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
    return UsageError(tool, what);
  }
  return std::nullopt;
}

int UsageError(std::string_view tool, std::string_view message) {
  std::cerr << tool << ": " << message << " (see " << tool << " --help)\n";
  return kExitUsage;
}

CLI::Validator NumberIn(double lo, double hi, std::string_view unit,
                        std::string_view zero_means) {
  const auto number = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.15g", v);
    return std::string(buf);
  };
  std::string accepted = number(lo) + ".." + number(hi);
  if (!unit.empty()) accepted += " " + std::string(unit);
  const bool zero_ok = !zero_means.empty();
  if (zero_ok) accepted += ", or 0 (" + std::string(zero_means) + ")";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        const bool parsed = !text.empty() && end == text.c_str() + text.size() && errno == 0;
        if (parsed && ((v >= lo && v <= hi) || (v == 0 && zero_ok))) return "";
        return (parsed ? "found " : "found '") + text + (parsed ? "" : "'") + "; give " +
               accepted;
      },
      "");
}

std::string UtcTimestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace strait::cli
