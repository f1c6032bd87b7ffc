#!/usr/bin/env bash
# Quick-start command 1: installs what is missing, builds the release preset and runs the demo.
# The demo is the codec benchmark on a gradient-like tensor (for each codec: compression ratio,
# error against the original, encode/decode speed beside memcpy), then a cross-region all-reduce
# through six straitd processes on 127.0.0.1 (loopback: quick, no root needed, no emulated WAN;
# the report says so) beside a flat ring. Extra arguments go to `strait-bench codec`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)" --target strait-bench straitd strait-wanem
echo
echo "== strait-bench codec (single thread, gradient-like data) =="
build/release/bench/strait-bench codec --size 16MiB "$@"
echo
echo "== strait-bench allreduce (3 regions x 2 ranks, int8 + error feedback, on loopback) =="
echo "   (on emulated WAN links, as root: drop --loopback; see bench/README.md)"
exec build/release/bench/strait-bench allreduce --loopback --size 16MiB --iters 3 \
  --codec int8 --baseline ring
