// The subcommands of strait-wanem (run, up, down, exec, list, selfcheck) behind its main().
// Kept in the core library so that tests can drive the same code paths.
#ifndef STRAIT_BENCH_WANEM_COMMANDS_H_
#define STRAIT_BENCH_WANEM_COMMANDS_H_

namespace strait::wanem {

// Parses argv and runs the chosen subcommand; returns the process exit code.
int RunCli(int argc, char** argv);

}  // namespace strait::wanem

#endif  // STRAIT_BENCH_WANEM_COMMANDS_H_
