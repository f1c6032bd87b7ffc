#!/usr/bin/env bash
# Quick-start command 1: installs what is missing, builds the release preset and runs the demo.
# Today the demo is the codec benchmark on a gradient-like tensor: for each codec it prints the
# compression ratio, the error against the original and the encode/decode speed beside memcpy.
# Extra arguments go to `strait-bench codec` (e.g. --size 64MiB, --json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)" --target strait-bench
echo
echo "== strait-bench codec (single thread, gradient-like data) =="
exec build/release/bench/strait-bench codec --size 16MiB "$@"
