// strait-wanem: user-space WAN emulator. Thin command-line layer over strait_wanem_core; see
// bench/README.md ("strait-wanem") for usage.

#include "bench/wanem/commands.h"

int main(int argc, char** argv) {
  return strait::wanem::RunCli(argc, argv);
}
