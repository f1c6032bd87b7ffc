#!/usr/bin/env bash
# Configures the project with STRAIT_CUDA_ROOT pointing nowhere and no nvcc on PATH:
# AUTO must succeed and say it builds without GPU kernels; ON must fail and say why.
set -euo pipefail
src=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
common=(-S "$src" -DSTRAIT_BUILD_TESTS=OFF -DSTRAIT_BUILD_BENCH=OFF
        -DSTRAIT_CUDA_ROOT="$work/no-cuda-here")
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
unset CUDACXX CUDA_PATH || true
out=$(cmake "${common[@]}" -B "$work/auto" -DSTRAIT_CUDA=AUTO 2>&1) || {
  echo "$out"; echo "FAIL: STRAIT_CUDA=AUTO without nvcc did not configure"; exit 1; }
grep -q "building without GPU kernels" <<<"$out" || {
  echo "$out"; echo "FAIL: AUTO did not say it builds without GPU kernels"; exit 1; }
if out=$(cmake "${common[@]}" -B "$work/on" -DSTRAIT_CUDA=ON 2>&1); then
  echo "$out"; echo "FAIL: STRAIT_CUDA=ON without nvcc configured anyway"; exit 1
fi
grep -q "STRAIT_CUDA=ON but no CUDA compiler was found" <<<"$out" || {
  echo "$out"; echo "FAIL: ON did not explain the missing compiler"; exit 1; }
if out=$(cmake "${common[@]}" -B "$work/bad" -DSTRAIT_CUDA=maybe 2>&1); then
  echo "FAIL: STRAIT_CUDA=maybe accepted"; exit 1
fi
grep -q "is not one of AUTO, ON, OFF" <<<"$out" || { echo "$out"; exit 1; }
echo "STRAIT_CUDA: AUTO, ON and a bad value behave as documented without nvcc"
