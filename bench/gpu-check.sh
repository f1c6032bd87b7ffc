#!/usr/bin/env bash
# The device check for the GPU kernels (lib/cuda): runs the `gpu` tests (the kernels byte-identical
# to the CPU codec, the stream honoured, bad arguments refused) and the kernel benchmark (GB/s of
# quantize with error feedback beside device-to-device copy bandwidth), well within 10 minutes.
#
#   bench/gpu-check.sh --prepare [DIR]   on a machine with nvcc and the build dependencies (no GPU
#                                        needed): configure a Release build in DIR (default
#                                        build/gpu-check) and build just the two GPU binaries.
#   bench/gpu-check.sh [DIR]             on the GPU machine: use the binaries in DIR when they are
#                                        there (a carried build: the device machine has no
#                                        network and no -dev packages), else configure and build
#                                        them first; then run them.
#
# Exit status: 0 all tests passed; 1 a test failed or nothing could be built; 77 no GPU (a clear
# message says so; nothing else runs). The benchmark's 0.8 goal is reported, not enforced.
# The binaries need only libzstd.so.1 and the C++ runtime (CUDA's runtime is linked statically),
# so a build made on Debian 12 runs on newer distributions with an NVIDIA driver for CUDA 13.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prepare=0
if [[ ${1:-} == --prepare ]]; then
  prepare=1
  shift
fi
build=${1:-$root/build/gpu-check}
[[ $build == /* ]] || build=$PWD/$build
test_bin=$build/tests/cuda/cuda_kernels_test
bench_bin=$build/bench/cuda_kernels_bench

build_binaries() {
  local cuda_root=${STRAIT_CUDA_ROOT:-/usr/local/cuda}
  echo "gpu-check: configuring a Release build in $build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRAIT_CUDA=ON \
    -DSTRAIT_CUDA_ROOT="$cuda_root" -DSTRAIT_BUILD_TESTS=ON -DSTRAIT_BUILD_BENCH=ON \
    >"$build.log" 2>&1 ||
    { tail -30 "$build.log"; echo "gpu-check: configure failed (log: $build.log); build with" \
        "--prepare where nvcc and the -dev packages are, and carry $build"; return 1; }
  echo "gpu-check: building cuda_kernels_test and cuda_kernels_bench"
  nice cmake --build "$build" -j "$(nproc)" --target cuda_kernels_test cuda_kernels_bench \
    >>"$build.log" 2>&1 || { tail -30 "$build.log"; echo "gpu-check: build failed"; return 1; }
}

if ((prepare)); then
  mkdir -p "$(dirname "$build")"
  build_binaries || exit 1
  echo "gpu-check: ready; carry these to the GPU machine and run bench/gpu-check.sh $build:"
  ls -l "$test_bin" "$bench_bin"
  exit 0
fi

# No GPU: say so and stop (77: "skipped" for ctest and automake).
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no GPU here (nvidia-smi is missing or lists no device); nothing to check"
  exit 77
fi
nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true

if [[ ! -x $test_bin || ! -x $bench_bin ]]; then
  mkdir -p "$(dirname "$build")"
  build_binaries || exit 1
fi

# From here on a CUDA runtime that sees no device is a failure, not a skip.
export STRAIT_REQUIRE_GPU=1
status=0
echo
echo "== gpu tests: $test_bin"
# ctest -L gpu where this build's test files point here; a carried build (made in another
# checkout path) runs the test binaries directly, which is what ctest would run.
if command -v ctest >/dev/null 2>&1 &&
  grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$root" "$build/CMakeCache.txt" 2>/dev/null; then
  timeout 300 ctest --test-dir "$build" -L gpu --output-on-failure || status=1
else
  timeout 300 "$test_bin" || status=1
  timeout 120 "$bench_bin" --size-mib 8 --iters 2 --warmup 1 >/dev/null || status=1
fi

echo
echo "== kernel benchmark: $bench_bin"
timeout 300 "$bench_bin" --size-mib 256 --iters 20 --warmup 3 || status=1

echo
if ((status == 0)); then
  echo "gpu-check: PASSED ($(date -u +%Y-%m-%dT%H:%MZ))"
else
  echo "gpu-check: FAILED (see above)"
fi
exit "$status"
