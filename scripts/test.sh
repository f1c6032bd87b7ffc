#!/usr/bin/env bash
# Quick-start command 2 (and what CI runs, through .ci/run): installs what is missing
# (scripts/setup.sh), builds the `ci` preset in build/ci (clang, AddressSanitizer +
# UndefinedBehaviorSanitizer, libFuzzer targets, warnings as errors; line tables as debug info:
# all the sanitizers' reports need, and 8-10% less compile time than full -g) and runs every test
# with ctest, fuzz runs included (20 s per target), then the Python tests (python/tests) against
# that build. Where nvcc is found (/usr/local/cuda/bin or $PATH) it also builds the `cuda` preset
# and runs the `gpu` tests. On 2 cores it takes 21 to 32 minutes from a fresh clone (about half
# building, half testing; README.md, "Quick start"). It sets STRAIT_LIBRARY, STRAITD, LD_PRELOAD
# and ASAN_OPTIONS for the Python tests itself and reads no environment variables of its own.
# Exits non-zero when any test fails.
#
#   scripts/test.sh              # install, build, run every test
#   scripts/test.sh --help       # print this and exit (-h too); it takes no other argument
set -euo pipefail
# shellcheck source=scripts/args.sh
source "$(dirname "$0")/args.sh"
takes_no_arguments "$0" "$@"
cd "$(dirname "$0")/.."
bash scripts/setup.sh
start=$(date +%s)
# Each phase's wall time goes to the end of the log: CI's budget is 25 min on 2 cores.
phases=()
lap=$start
phase() { phases+=("$1 $(( $(date +%s) - lap )) s"); lap=$(date +%s); }
# Printed on every exit, a failing one too.
report() {
  echo "test.sh: build and tests took $(( $(date +%s) - start )) s ($(IFS=,; echo "${phases[*]}"))"
}
trap report EXIT
cmake --preset ci >/dev/null
cmake --build --preset ci -j"$(nproc)"
phase "ci build:"
# The GPU code (lib/cuda kernels, their tests and benchmark, the NCCL end-to-end program) is not in
# the ci preset (clang with sanitizers is no host compiler for nvcc). Where nvcc is installed, build
# it with the `cuda` preset so CI catches code that no longer compiles, and run the `gpu` tests
# below: they skip themselves without a device and run for real on a GPU machine. It builds while
# the tests run, at the lowest priority: most tests wait on sockets and emulated links, and the
# compiler takes the idle cores (it used to start after them). Its own process group, so that a
# failing test run stops all of it.
cuda_pid=
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then
  # Its GPU test starts the ci preset's straitd: the gateway is compiled once.
  cmake --preset cuda -DSTRAIT_WERROR=ON -DSTRAIT_TEST_STRAITD="$PWD/build/ci/tools/straitd/straitd" \
    >/dev/null
  setsid nice -n 19 cmake --build --preset cuda -j"$(nproc)" --target strait_cuda cuda_kernels_test \
    cuda_kernels_bench strait_nccl_allreduce strait_api nccl_backend_test nccl-net-strait \
    >build/cuda-build.log 2>&1 &
  cuda_pid=$!
  # An if, not `&&`: under set -e a failing kill (the build already over) would end the trap
  # before the report.
  trap 'if [ -n "$cuda_pid" ]; then kill -- -"$cuda_pid" 2>/dev/null || true; fi; report' EXIT
else
  echo "test.sh: no nvcc (CUDA Toolkit) found: GPU code not compiled"
fi
ctest --preset ci -j"$(nproc)"
phase "ctest:"
# The Python package (python/: ctypes wrapper, DDP hook, `strait` backend) against this build's
# libstrait.so and straitd, with real straitd processes on loopback. The library carries ASan and
# UBSan, whose runtime must be the first library of the process: preload clang's (python3 itself
# is not instrumented; its and torch's leaks at exit are not ours to report).
ASAN_RT=$(clang -print-file-name=libclang_rt.asan-x86_64.so)
STRAIT_LIBRARY=$PWD/build/ci/lib/api/libstrait.so STRAITD=$PWD/build/ci/tools/straitd/straitd \
  LD_PRELOAD=$ASAN_RT ASAN_OPTIONS=detect_leaks=0 \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests
phase "pytest:"
if [ -n "$cuda_pid" ]; then
  if ! wait "$cuda_pid"; then
    cuda_pid=
    tail -n 60 build/cuda-build.log
    echo "test.sh: the cuda preset's build failed (whole log: build/cuda-build.log)"
    exit 1
  fi
  cuda_pid=
  ctest --test-dir build/cuda -L gpu --output-on-failure
  # The shipped form of the NCCL plugin (libstdc++ linked in, glibc <= 2.34): the ci preset's
  # sanitizer build links it against shared libstdc++, so its own check skips there.
  ctest --test-dir build/cuda -R '^nccl_plugin_self_contained$' --no-tests=error --output-on-failure
  phase "cuda build (rest) and gpu tests:"
fi
