// The project version every Strait binary reports: CMake's project(VERSION) and `git describe`
// at configure time, and the one line every tool prints for `--version`. Also the exit code
// every tool gives for a bad flag or flag value, so that scripts can tell usage errors apart.
//
//   std::puts(strait::VersionLine("straitd").c_str());   // "straitd 0.1.0 (git 1ff5800)"
#ifndef STRAIT_LIB_COMMON_VERSION_H_
#define STRAIT_LIB_COMMON_VERSION_H_

#include <string>
#include <string_view>

namespace strait {

// A bad flag, a missing required flag or an invalid flag value, on every tool (the getopt and
// CLI11 convention; CLI11's own codes 105-114 are not used).
inline constexpr int kExitUsage = 2;

// "0.1.0": CMake's PROJECT_VERSION.
const char* ProjectVersion() noexcept;
// `git describe --always --tags` of the source tree at configure time, or "unknown".
const char* GitDescribe() noexcept;
// "<tool> <version> (git <describe>)", for --version.
std::string VersionLine(std::string_view tool);

}  // namespace strait

#endif  // STRAIT_LIB_COMMON_VERSION_H_
