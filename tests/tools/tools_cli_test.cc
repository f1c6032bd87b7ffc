// Issue 17 (operator findings): every Strait tool answers --version with its name and the
// project version, exits 2 for any usage error (an unknown flag, a bad value, a missing
// argument: CLI11's own codes 105-114 used to leak out), and its --json report carries the
// common fields tool, version and timestamp. Runs the built binaries as processes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/common/straitd_process.h"

namespace {

using Result = strait::test::CapturedRun;

Result RunTool(const std::vector<std::string>& argv) { return strait::test::RunCaptured(argv); }

struct Tool {
  const char* name;
  const char* path;
};

const Tool kTools[] = {
    {"straitd", STRAITD_BINARY},
    {"strait-bench", STRAIT_BENCH_BINARY},
    {"strait-wanem", STRAIT_WANEM_BINARY},
    {"codec_micro", CODEC_MICRO_BINARY},
    {"strait-certs", STRAIT_CERTS_SCRIPT},  // the installed copy, version filled in by CMake
};

TEST(ToolsCli, EveryToolPrintsItsNameAndTheProjectVersion) {
  for (const Tool& tool : kTools) {
    const Result r = RunTool({tool.path, "--version"});
    EXPECT_EQ(r.code, 0) << tool.name << ": " << r.err;
    // "<tool> <version>", then " (git <describe>)" from the compiled tools.
    const std::string want = std::string(tool.name) + " " + STRAIT_PROJECT_VERSION;
    EXPECT_EQ(r.out.rfind(want, 0), 0u) << tool.name << " printed: " << r.out;
    EXPECT_TRUE(!r.out.empty() && r.out.back() == '\n') << tool.name;
  }
}

TEST(ToolsCli, AnUnknownFlagExitsTwoOnEveryTool) {
  for (const Tool& tool : kTools) {
    const Result r = RunTool({tool.path, "--no-such-flag"});
    EXPECT_EQ(r.code, 2) << tool.name << ": " << r.err;
    EXPECT_NE(r.err.find("no-such-flag"), std::string::npos) << tool.name << ": " << r.err;
  }
}

// The exit codes the operator saw: 106, 109, 114 (CLI11's validation, extras and argument
// mismatch errors), now all the usage code.
TEST(ToolsCli, BadValuesAndMissingArgumentsExitTwo) {
  const std::vector<std::vector<std::string>> cases = {
      {STRAITD_BINARY, "--check-config"},                      // option without its value
      {STRAITD_BINARY, "--config", "a.toml", "extra"},         // a stray positional argument
      {STRAIT_BENCH_BINARY, "codec", "--iters", "many"},       // not a number
      {STRAIT_BENCH_BINARY, "no-such-command"},                // unknown subcommand
      {STRAIT_WANEM_BINARY, "exec"},                           // required region missing
      {STRAIT_WANEM_BINARY, "selfcheck", "--seconds", "abc"},  // not a number
      {STRAIT_WANEM_BINARY, "up", "--mtu", "10"},              // checked after parsing
      {STRAIT_CERTS_SCRIPT, "ca", "--dir"},                    // the shell said 1 here
  };
  for (const auto& argv : cases) {
    const Result r = RunTool(argv);
    std::string line;
    for (const std::string& a : argv) line += a + " ";
    EXPECT_EQ(r.code, 2) << line << "\n" << r.err;
    EXPECT_FALSE(r.err.empty()) << line;
  }
}

TEST(ToolsCli, HelpStillExitsZero) {
  for (const Tool& tool : kTools) {
    if (std::string(tool.name) == "codec_micro") continue;  // Google Benchmark's own --help
    const Result r = RunTool({tool.path, "--help"});
    EXPECT_EQ(r.code, 0) << tool.name << ": " << r.err;
    EXPECT_NE(r.out.find("--version"), std::string::npos) << tool.name << ": " << r.out;
  }
}

TEST(ToolsCli, JsonReportsCarryToolVersionAndTimestamp) {
  const Result r = RunTool({STRAIT_BENCH_BINARY, "codec", "--size", "64KiB", "--iters", "1",
                        "--dtypes", "fp32", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j.value("tool", ""), "strait-bench");
  EXPECT_EQ(j.value("command", ""), "codec");
  EXPECT_EQ(j.value("version", ""), STRAIT_PROJECT_VERSION);
  const std::string timestamp = j.value("timestamp", "");
  EXPECT_EQ(timestamp.size(), 20u) << timestamp;  // 2026-11-29T18:48:58Z
  EXPECT_EQ(timestamp.back(), 'Z') << timestamp;
  // The old names are gone: one name per thing across tools.
  EXPECT_FALSE(j.contains("benchmark"));
  EXPECT_FALSE(j.contains("date"));
}

}  // namespace
