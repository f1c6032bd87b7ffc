#!/usr/bin/env bash
# ThreadSanitizer run of the threaded modules' tests (net, collective, gateway, localproto, the
# plugin and library mode), kept apart from scripts/test.sh because a second instrumented build
# does not fit CI's 25-minute budget on 2 cores (this takes 15-25 min there). Run it before
# merging changes to locking, threads or event loops; it exits non-zero on any report.
#
#   bash scripts/tsan.sh            # build the `tsan` preset and run the tests below
#   bash scripts/tsan.sh -R Tunnel  # extra ctest arguments narrow the run
set -euo pipefail
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
