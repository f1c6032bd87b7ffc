#!/usr/bin/env bash
# Quick-start command 2 (and what CI runs): installs what is missing, builds the `ci` preset
# (clang, AddressSanitizer + UndefinedBehaviorSanitizer, libFuzzer targets, warnings as errors)
# and runs every test, fuzz runs included. Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
start=$(date +%s)
cmake --preset ci >/dev/null
cmake --build --preset ci -j"$(nproc)"
ctest --preset ci -j"$(nproc)"
echo "test.sh: build and tests took $(( $(date +%s) - start )) s"
