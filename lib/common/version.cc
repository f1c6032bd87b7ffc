// The project version (see version.h). STRAIT_VERSION_STRING and STRAIT_GIT_DESCRIBE are set on
// this file alone (lib/common/CMakeLists.txt), so a new commit recompiles one file.
#include "common/version.h"

#ifndef STRAIT_VERSION_STRING
#error "STRAIT_VERSION_STRING must come from CMake's project version"
#endif
#ifndef STRAIT_GIT_DESCRIBE
#define STRAIT_GIT_DESCRIBE "unknown"
#endif

namespace strait {

const char* ProjectVersion() noexcept {
  return STRAIT_VERSION_STRING;
}

const char* GitDescribe() noexcept {
  return STRAIT_GIT_DESCRIBE;
}

std::string VersionLine(std::string_view tool) {
  return std::string(tool) + " " + ProjectVersion() + " (git " + GitDescribe() + ")";
}

}  // namespace strait
