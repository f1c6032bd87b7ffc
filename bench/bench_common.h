// Pieces every strait-bench subcommand shares: the global flags, how a subcommand plugs into the
// main program, exit codes, flag validators with uniform error messages, the machine description
// printed in report headers, a TTY progress line and page-aligned buffers.
//
// Adding a subcommand: write `CommandMain SetupFooCommand(CLI::App& cmd)` in its own file (it
// adds its flags to `cmd` and returns the function to run once parsing succeeded), then add one
// line to the table in strait_bench_main.cc.
#ifndef STRAIT_BENCH_BENCH_COMMON_H_
#define STRAIT_BENCH_BENCH_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/version.h"
#include "tools/cli/cli_fwd.h"

namespace strait::bench {

inline constexpr int kExitOk = 0;
// A measurement could not be made or a codec gave wrong results.
inline constexpr int kExitFailure = 1;
// A bad flag or flag value: the same code on every Strait tool (common/version.h).
inline constexpr int kExitUsage = strait::kExitUsage;

// Flags of the main program, visible to every subcommand.
struct GlobalFlags {
  bool json = false;  // one JSON object on stdout instead of the human table
};

// What main runs when a subcommand was chosen; returns the process exit code.
using CommandMain = std::function<int(const GlobalFlags&)>;
// Adds a subcommand's flags to `cmd` and returns its CommandMain.
using CommandSetup = CommandMain (*)(CLI::App& cmd);

// Prints "strait-bench <command>: <flag>: <message>" on stderr and returns kExitUsage, for flag
// values that only a subcommand can judge (after CLI11 has parsed them).
int UsageError(std::string_view command, std::string_view flag, std::string_view message);

// CLI11 validators whose errors read "<flag>: <what is allowed>, got '<text>'".
// Sizes go through strait::ParseSize and are replaced by the byte count, so the option may be
// bound to an integer: attach SizeValidator with Option::transform (check() would not let it
// rewrite the value).
CLI::Validator SizeValidator(uint64_t min_bytes, uint64_t max_bytes);
CLI::Validator IntValidator(int64_t min, int64_t max);
CLI::Validator UintValidator(uint64_t min, uint64_t max);

// Splits "a,b,,c" into {"a", "b", "c"}, trimming spaces.
std::vector<std::string> SplitList(std::string_view text);

// `v` with `decimals` digits after the point ("%.*f").
std::string Fixed(double v, int decimals);
// Left-aligns the first `left` columns and right-aligns the rest, two spaces apart; one row per
// line, trailing spaces removed. Rows may have different lengths.
std::string AlignColumns(const std::vector<std::vector<std::string>>& rows, size_t left);

// "AMD EPYC 9654 96-Core Processor" from /proc/cpuinfo, or "unknown".
std::string CpuModelName();
// "2026-11-29T18:48:58Z".
std::string UtcTimestamp();

// The name every --json report gives as "tool"; the subcommand goes in "command".
inline constexpr const char* kToolName = "strait-bench";

// One status line on stderr, rewritten in place with '\r'. Silent unless stderr is a terminal,
// so that logs and pipes stay clean. Clear() erases it before the report is printed.
class ProgressLine {
 public:
  ProgressLine();
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  void Update(std::string_view text);
  void Clear();

 private:
  bool enabled_;
  size_t last_width_ = 0;
};

// A zero-filled buffer aligned to 64 bytes (a cache line, and an AVX-512 register), with every
// page touched up front so that page faults are not part of a measurement.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data_.get());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data_.get());
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
};

}  // namespace strait::bench

#endif  // STRAIT_BENCH_BENCH_COMMON_H_
