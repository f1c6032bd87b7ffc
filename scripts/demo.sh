#!/usr/bin/env bash
# Quick-start command 1: installs what is missing, builds the release preset and runs the demo.
# The demo is the codec benchmark on a gradient-like tensor (for each codec: compression ratio,
# error against the original, encode/decode speed beside memcpy), then a cross-region all-reduce
# through six straitd processes on 127.0.0.1 (loopback: quick, no root needed, no emulated WAN;
# the report says so) beside a flat ring, and last a short PyTorch training run on loopback (2
# regions x 2 ranks, load_digits): plain gloo DDP beside DDP with the Strait hook (int8 with error
# feedback), each rank with its own straitd. Installs what is missing first (scripts/setup.sh)
# and builds the release preset in build/release; on 2 cores it takes 4.8 to 6 minutes from a
# fresh clone, less once built. It sets STRAIT_LIBRARY and PYTHONPATH for the PyTorch run
# itself and reads no environment variables of its own.
#
#   scripts/demo.sh                       # install, build, run the demo
#   scripts/demo.sh --size 64MiB --codecs int8,zstd
#                                         # options of `strait-bench codec`, for its part
#   scripts/demo.sh --help                # print this and exit (-h too)
set -euo pipefail
# shellcheck source=scripts/args.sh
source "$(dirname "$0")/args.sh"
# `strait-bench codec`'s options (bench/codec_bench_cli.cc, each with a value) and the global
# ones it takes after the subcommand (bench/strait_bench_main.cc): checked here, so that a typo
# fails now and not after the build.
codec_options=(--size --codecs --dtypes --iters --zstd-level --block --rounding --seed
               --log-level)
refuse() {
  echo "demo.sh: $1; extra arguments are options of strait-bench codec (${codec_options[*]}," \
    "--json); see scripts/demo.sh --help" >&2
  exit 2
}
size=(--size 16MiB)
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  a=${args[i]}
  case $a in
    -h|--help) print_script_help "$0"; exit 0 ;;
    --json) continue ;;
  esac
  [[ " ${codec_options[*]} " == *" ${a%%=*} "* ]] || refuse "unexpected argument '$a'"
  # strait-bench takes an option once: a --size given here replaces the demo's.
  [[ ${a%%=*} == --size ]] && size=()
  if [[ $a != *=* ]] && ((++i >= ${#args[@]})); then
    refuse "$a needs a value"
  fi
done
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)" --target strait-bench straitd strait-wanem \
  strait_api
echo
echo "== strait-bench codec (single thread, gradient-like data) =="
build/release/bench/strait-bench codec "${size[@]}" "$@"
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
