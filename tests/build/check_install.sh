#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then configures, builds and runs a consumer
# project that uses find_package(Strait) and links strait::codec (C++) and strait::api (C).
set -euo pipefail
build=$1 consumer=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/strait/codec.h"
test -f "$work/prefix/include/strait/strait.h"
test -f "$work/prefix/lib/cmake/Strait/StraitConfig.cmake"
# The consumer builds without sanitizers or CI flags: it is what a user's project looks like.
flags=""
grep -q 'fsanitize=address' "$build/CMakeCache.txt" && flags="-fsanitize=address,undefined"
compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
c_compiler=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
cmake -S "$consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER="$compiler" -DCMAKE_C_COMPILER="$c_compiler" \
  "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_C_FLAGS=$flags" \
  "-DCMAKE_EXE_LINKER_FLAGS=$flags" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"
"$work/build/consumer_c"
