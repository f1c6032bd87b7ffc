#!/usr/bin/env bash
# ThreadSanitizer run of the threaded modules' tests (net, collective, gateway, localproto, the
# plugin and library mode), kept apart from scripts/test.sh because a second instrumented build
# does not fit CI's 25-minute budget on 2 cores. Run it before merging changes to locking,
# threads or event loops; it exits non-zero on any report. Installs what is missing first
# (scripts/setup.sh), then builds the `tsan` preset in build/tsan (about 25 min on 2 cores) and
# runs its 378 tests (about 10 min more). Reads TSAN_OPTIONS: yours are added after
# halt_on_error=1 second_deadlock_stack=1, so they win.
#
#   bash scripts/tsan.sh            # build the `tsan` preset and run the tests below
#   bash scripts/tsan.sh -R Tunnel  # extra ctest arguments (options, each with its value) narrow
#                                   # the run
#   bash scripts/tsan.sh --help     # print this and exit (-h too)
set -euo pipefail
# shellcheck source=scripts/args.sh
source "$(dirname "$0")/args.sh"
# Extra arguments go to ctest, which ignores a stray word: refuse one here, before the build.
prev=
for a in "$@"; do
  case $a in
    -h|--help) print_script_help "$0"; exit 0 ;;
    -*) ;;
    *)
      if [[ $prev != -* ]]; then
        echo "tsan.sh: unexpected argument '$a': extra arguments are ctest options, e.g." \
          "-R Tunnel; see scripts/tsan.sh --help" >&2
        exit 2
      fi ;;
  esac
  prev=$a
done
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset tsan -DSTRAIT_CUDA=OFF >/dev/null
cmake --build build/tsan -j"$(nproc)"
# halt_on_error: the first race fails its test (a report must not scroll past as a warning);
# second_deadlock_stack: lock-order reports name both acquisitions.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
# Test names (gtest suites) of the threaded modules: the net links and listeners, the collective
# over real transports, the gateway and straitd processes, the plugin and CollNet, library mode.
regex='^(net|collective|gateway|localproto|straitd|plugin|nccl|api|host_backend|restart_soak|'
regex+='Net|Collective|Gateway|Straitd|Tunnel|Localproto|Plugin|Api|StraitApi|LiveComm|Link|Tls|'
regex+='AcceptPause|SocketPair|Http|Mailbox|AllReduce|WorldByCount|Shapes|Hierarchical|'
regex+='RegionPhases|LocalWorld|CollNet|Killed|Transport|Dial|StreamCountController)'
ctest --test-dir build/tsan -j"$(nproc)" --output-on-failure -R "$regex" -LE gpu "$@"
