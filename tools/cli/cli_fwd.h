// Forward declarations of the CLI11 classes that Strait's headers name (CLI::App, CLI::Validator),
// so that a header can declare `Setup(CLI::App&)` without compiling CLI11. Debian's CLI11 2.1 is
// header-only: every file that includes <CLI/CLI.hpp> compiles its whole implementation again
// (about 5 s per file under the ci preset's sanitizers), so only the files that build or parse
// an App include it.
#ifndef STRAIT_TOOLS_CLI_CLI_FWD_H_
#define STRAIT_TOOLS_CLI_CLI_FWD_H_

namespace CLI {
class App;
class Validator;
}  // namespace CLI

#endif  // STRAIT_TOOLS_CLI_CLI_FWD_H_
