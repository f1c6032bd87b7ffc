// strait-bench: Strait's benchmark tool. Each subcommand measures one layer against its bound
// (codec throughput against memcpy on the same machine, ...) and prints a human table, or one
// JSON object with --json.
//
// Exit codes: 0 measured (goals may still be MISSed: a benchmark reports, it does not judge),
// 1 a measurement failed or a codec produced wrong results, 2 a bad flag or flag value (as on
// every Strait tool, tools/cli/cli.h). `--version` prints the tool's version; --json reports
// start with "tool", "version", "timestamp" and "command" (the subcommand).
#include <CLI/CLI.hpp>
#include <iostream>
#include <string>
#include <vector>

#include "bench/allreduce_bench.h"
#include "bench/bench_common.h"
#include "bench/codec_bench.h"
#include "bench/link_bench.h"
#include "common/log.h"
#include "tools/cli/cli.h"

namespace {

struct Command {
  const char* name;
  const char* description;
  strait::bench::CommandSetup setup;
};

// Every subcommand, registered here and nowhere else.
constexpr Command kCommands[] = {
    {"codec", "Codec speed, ratio and error on gradient-like data, against memcpy",
     &strait::bench::SetupCodecCommand},
    {"link", "WAN link goodput per stream count, RTT, retransmissions, codecs on the link",
     &strait::bench::SetupLinkCommand},
    {"allreduce", "Cross-region all-reduce through straitd on emulated links, beside a ring",
     &strait::bench::SetupAllReduceCommand},
};

}  // namespace

int main(int argc, char** argv) {
  using strait::bench::kExitUsage;

  if (strait::Status s = strait::InitLogLevelFromEnv(); !s.ok()) {
    std::cerr << "strait-bench: " << s.message() << '\n';
    return kExitUsage;
  }

  CLI::App app{"strait-bench: Strait benchmarks. Every figure is printed beside its bound.",
               "strait-bench"};
  app.require_subcommand(1);
  strait::cli::AddVersionFlag(app, "strait-bench");
  // Global flags are accepted after the subcommand too: `strait-bench codec --json`.
  app.fallthrough();

  strait::bench::GlobalFlags globals;
  std::string log_level;
  app.add_flag("--json", globals.json, "Print one JSON object instead of the human table");
  app.add_option("--log-level", log_level, "Log level: error, warn, info, debug, trace (or 0-4)")
      ->type_name("LEVEL");

  std::vector<std::pair<CLI::App*, strait::bench::CommandMain>> mains;
  for (const Command& command : kCommands) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    mains.emplace_back(sub, command.setup(*sub));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    // CLI11 reports a misspelt subcommand as "a subcommand is required"; name it instead.
    std::string known;
    for (const Command& command : kCommands) {
      known += known.empty() ? "" : ", ";
      known += command.name;
    }
    const std::vector<std::string> extra = app.remaining();
    if (app.get_subcommands().empty()) {
      if (!extra.empty()) {
        const bool is_flag = extra.front().rfind('-', 0) == 0;
        std::cerr << "strait-bench: unknown " << (is_flag ? "option" : "subcommand") << " '"
                  << extra.front() << "'; subcommands: " << known << " (see strait-bench --help)\n";
        return kExitUsage;
      }
      if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
        std::cerr << "strait-bench: a subcommand is required; available: " << known
                  << " (see strait-bench --help)\n";
        return kExitUsage;
      }
    }
    std::cerr << "strait-bench: " << e.what() << " (see strait-bench --help)\n";
    return kExitUsage;
  }

  if (!log_level.empty()) {
    strait::StatusOr<strait::LogLevel> level = strait::ParseLogLevel(log_level);
    if (!level.ok()) {
      return strait::bench::UsageError("", "--log-level", level.status().message());
    }
    strait::SetLogLevel(*level);
  }

  for (auto& [sub, run] : mains) {
    if (sub->parsed()) return run(globals);
  }
  return kExitUsage;  // unreachable: require_subcommand(1)
}
