#!/usr/bin/env bash
# Quick-start command 1: installs what is missing, builds the release preset and runs the demo.
# The demo is the codec benchmark on a gradient-like tensor (for each codec: compression ratio,
# error against the original, encode/decode speed beside memcpy), then a cross-region all-reduce
# through six straitd processes on 127.0.0.1 (loopback: quick, no root needed, no emulated WAN;
# the report says so) beside a flat ring, and last a short PyTorch training run on loopback (2
# regions x 2 ranks, load_digits): plain gloo DDP beside DDP with the Strait hook (int8 with error
# feedback), each rank with its own straitd. Extra arguments go to `strait-bench codec`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)" --target strait-bench straitd strait-wanem \
  strait_api
echo
echo "== strait-bench codec (single thread, gradient-like data) =="
build/release/bench/strait-bench codec --size 16MiB "$@"
echo
echo "== strait-bench allreduce (3 regions x 2 ranks, int8 + error feedback, on loopback) =="
echo "   (on emulated WAN links, as root: drop --loopback; see bench/README.md)"
build/release/bench/strait-bench allreduce --loopback --size 16MiB --iters 3 \
  --codec int8 --baseline ring
echo
echo "== PyTorch DDP on loopback (2 regions x 2 ranks, digits MLP, 300 steps): gloo DDP, then the"
echo "   Strait hook (int8 + error feedback, a straitd per rank); see README.md, PyTorch =="
export STRAIT_LIBRARY=$PWD/build/release/lib/api/libstrait.so PYTHONPATH=$PWD/python
for hook in none strait; do
  args=(--regions 2 --ranks 2 --straitd build/release/tools/straitd/straitd)
  [[ $hook == none ]] && args+=(--no-gateways)
  /usr/bin/python3 -m strait.launch "${args[@]}" -- /usr/bin/python3 \
    examples/pytorch/train_ddp.py --hook "$hook" --compression int8,ef --steps 300 --quiet
done
