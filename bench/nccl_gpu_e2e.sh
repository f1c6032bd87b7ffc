#!/usr/bin/env bash
# GPU end to end for the NCCL plugin: a real NCCL all-reduce (bench/gpu/nccl_allreduce.cu) by
# four processes on GPU 0 in two regions, through libnccl-net-strait.so and straitd, beside NCCL's
# own Socket transport. Each process gets its own NCCL_HOSTID, so NCCL sees four nodes and every
# byte crosses the net plugin (a test setup: NVIDIA does not support several ranks per GPU in
# production). Loopback only: no namespaces, no root; gateways talk plain TCP on 127.0.0.1.
#
#   bench/nccl_gpu_e2e.sh --prepare [DIR]   where nvcc and the build dependencies are (no GPU
#                                           needed): configure a Release build in DIR (default
#                                           build/gpu-e2e) and build straitd, the plugin and the
#                                           all-reduce program.
#   bench/nccl_gpu_e2e.sh [options] [DIR]   on the GPU machine: use the binaries in DIR when they
#                                           are there (a carried build), else build them first;
#                                           then run every mode.
#   bench/nccl_gpu_e2e.sh --gateways-only [DIR]   no GPU needed: start and stop the gateways of
#                                           both layouts and check they served (the script's
#                                           non-GPU half).
# Options: --modes socket,strait,collnet (default all three)  --sizes 1M,16M,64M  --iters 5
#          --warmup 1  --run-timeout 150 (seconds per mode)  --keep (keep the work directory)
#
# Modes (4 ranks: 0 and 1 in region "us", 2 and 3 in region "eu"):
#   socket   NCCL_NET=Socket (the baseline: NCCL's own TCP transport, no plugin, no gateway).
#   strait   NCCL_NET=Strait: same-region pairs over the plugin's direct TCP, cross-region pairs
#            through one straitd per region (shard 0 each). One gateway per region because a
#            gateway tunnels only to its own shard index in other regions, and NCCL's rings and
#            trees may pair any rank of one region with any rank of the other.
#   collnet  strait plus NCCL_COLLNET_ENABLE=1: one straitd per rank (CollNet needs every node head
#            on a straitd of its own), shard indexes us 0,1 / eu 1,0 so that the ring's
#            cross-region neighbours (1->2, 3->0) share a shard should NCCL fall back to point to
#            point. The plugin's tuner selects CollNet for all-reduce whenever NCCL offers it.
# Every mode checks every element of every all-reduce (exact small-integer sums); a wrong result,
# a rank that fails or a mode that overruns --run-timeout fails the script.
# Time: about a minute per mode on loopback with the defaults; the timeouts bound it under 10 min.
#
# Exit status: 0 every mode ran and every result was exact; 1 a wrong result, a failed or hung
# rank, or nothing could be built; 2 bad usage; 77 no GPU (a clear message says so; nothing runs).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prepare=0
gateways_only=0
keep=0
modes=socket,strait,collnet
sizes=1M,16M,64M
iters=5
warmup=1
run_timeout=150
build=

usage() {
  sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit "${1:-2}"
}
die() { echo "nccl_gpu_e2e: $*" >&2; exit 2; }

while (($#)); do
  case $1 in
    --prepare) prepare=1 ;;
    --gateways-only) gateways_only=1 ;;
    --keep) keep=1 ;;
    --modes) modes=${2:?--modes needs a value}; shift ;;
    --sizes) sizes=${2:?--sizes needs a value}; shift ;;
    --iters) iters=${2:?--iters needs a value}; shift ;;
    --warmup) warmup=${2:?--warmup needs a value}; shift ;;
    --run-timeout) run_timeout=${2:?--run-timeout needs a value}; shift ;;
    -h | --help) usage 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [[ -z $build ]] || die "one build directory only (got $build and $1)"; build=$1 ;;
  esac
  shift
done
for m in ${modes//,/ }; do
  [[ $m == socket || $m == strait || $m == collnet ]] ||
    die "unknown mode '$m' in --modes; allowed: socket, strait, collnet"
done
[[ $iters =~ ^[1-9][0-9]*$ ]] || die "--iters must be a positive integer, not '$iters'"
[[ $warmup =~ ^[0-9]+$ ]] || die "--warmup must be a non-negative integer, not '$warmup'"
[[ $run_timeout =~ ^[1-9][0-9]*$ ]] || die "--run-timeout must be a positive integer"
[[ $sizes =~ ^[0-9]+[KMG]?(,[0-9]+[KMG]?)*$ ]] || die "--sizes: comma-separated sizes like 1M,64M"

build=${build:-$root/build/gpu-e2e}
[[ $build == /* ]] || build=$PWD/$build
cuda_root=${STRAIT_CUDA_ROOT:-/usr/local/cuda}
straitd=$build/tools/straitd/straitd
plugin=$build/plugins/nccl/libnccl-net-strait.so
program=$build/bench/strait_nccl_allreduce

build_binaries() {  # $@: targets
  echo "nccl_gpu_e2e: configuring a Release build in $build"
  mkdir -p "$(dirname "$build")"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRAIT_CUDA="$1" \
    -DSTRAIT_CUDA_ROOT="$cuda_root" >"$build.log" 2>&1 ||
    { tail -30 "$build.log"; echo "nccl_gpu_e2e: configure failed (log: $build.log); build with" \
        "--prepare where nvcc and the -dev packages are, and carry $build"; return 1; }
  shift
  echo "nccl_gpu_e2e: building $*"
  nice cmake --build "$build" -j "$(nproc)" --target "$@" >>"$build.log" 2>&1 ||
    { tail -30 "$build.log"; echo "nccl_gpu_e2e: build failed (log: $build.log)"; return 1; }
}

if ((prepare)); then
  build_binaries ON straitd nccl-net-strait strait_nccl_allreduce || exit 1
  echo "nccl_gpu_e2e: ready; carry $build to the GPU machine and run bench/nccl_gpu_e2e.sh $build"
  ls -l "$straitd" "$plugin" "$program"
  exit 0
fi

# No GPU: say so and stop (77: "skipped" for ctest and automake) before building anything.
if ((!gateways_only)); then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "nccl_gpu_e2e: no GPU here (nvidia-smi is missing or lists no device); nothing to run"
    exit 77
  fi
  nvidia-smi -L | head -1
fi

if ((gateways_only)); then
  [[ -x $straitd ]] || build_binaries OFF straitd || exit 1
else
  if [[ ! -x $straitd || ! -e $plugin || ! -x $program ]]; then
    build_binaries ON straitd nccl-net-strait strait_nccl_allreduce || exit 1
  fi
fi

work=$(mktemp -d /tmp/strait-gpu-e2e-XXXXXX)
gateway_pids=()
stop_gateways() {
  local pid
  for pid in "${gateway_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${gateway_pids[@]}"; do wait "$pid" 2>/dev/null; done
  gateway_pids=()
}
cleanup() {
  stop_gateways
  if ((keep)); then echo "nccl_gpu_e2e: work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Free TCP ports on 127.0.0.1 (bound and released by the kernel's choice).
free_ports() {  # $1: how many
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# start_gateways LAYOUT: per-region (us0, eu0) or per-rank (us0, us1, eu1, eu0 for ranks 0-3).
# Sets gw_socket[rank] for every rank. Fails when a daemon does not come up within 20 s.
gw_socket=()
start_gateways() {
  local layout=$1 names=() regions=() shards=() rank_gw=() ports peers i c region
  if [[ $layout == per-region ]]; then
    names=(us0 eu0); regions=(us eu); shards=(0 0); rank_gw=(0 0 1 1)
  else
    names=(us0 us1 eu1 eu0); regions=(us us eu eu); shards=(0 1 1 0); rank_gw=(0 1 2 3)
  fi
  read -r -a ports <<<"$(free_ports "${#names[@]}")" || return 1
  for i in "${!names[@]}"; do
    # Every region's gateways; the own region's table only when it has others (straitd refuses
    # a [peers.<own region>] that lists only itself).
    peers=""
    for region in us eu; do
      local table="" others=0 j
      for j in "${!names[@]}"; do
        [[ ${regions[j]} == "$region" ]] || continue
        table+="shard_${shards[j]} = \"127.0.0.1:${ports[j]}\""$'\n'
        ((j != i)) && ((++others))
      done
      ((others > 0)) && peers+="[peers.$region]"$'\n'"$table"
    done
    c="$work/${names[i]}.toml"
    cat >"$c" <<EOF
region = "${regions[i]}"
shard_index = ${shards[i]}
[local]
socket = "$work/${names[i]}.sock"
allowed_uids = [$(id -u)]
[wan]
listen = "127.0.0.1:${ports[i]}"
transport = "plain"
${peers}[link]
streams = 4
unreachable_after = "10s"
[allreduce]
deadline = "60s"
shutdown_grace = "2s"
EOF
    "$straitd" --check-config "$c" >"$work/${names[i]}.check" 2>&1 ||
      { cat "$work/${names[i]}.check"; echo "nccl_gpu_e2e: straitd rejects $c"; return 1; }
    "$straitd" --config "$c" >"$work/${names[i]}.log" 2>&1 &
    gateway_pids+=($!)
  done
  for i in "${!names[@]}"; do
    local tries=0
    until [[ -S $work/${names[i]}.sock ]]; do
      if ((++tries > 400)) || ! kill -0 "${gateway_pids[i]}" 2>/dev/null; then
        tail -20 "$work/${names[i]}.log"
        echo "nccl_gpu_e2e: straitd ${names[i]} did not come up (log above)"
        return 1
      fi
      sleep 0.05
    done
  done
  gw_socket=()
  for i in 0 1 2 3; do gw_socket[i]=$work/${names[${rank_gw[i]}]}.sock; done
  echo "nccl_gpu_e2e: gateways up ($layout: ${names[*]})"
}

# run_mode MODE: four ranks; rank 0's RESULT lines go to $work/MODE.results.
run_mode() {
  local mode=$1 r pids=() rc=0 layout=
  local uid="$work/$mode.uid"
  rm -f "$uid"
  case $mode in
    strait) layout=per-region ;;
    collnet) layout=per-rank ;;
  esac
  if [[ -n $layout ]]; then start_gateways "$layout" || return 1; fi
  for r in 0 1 2 3; do
    local region=us
    ((r >= 2)) && region=eu
    local env=(
      "NCCL_HOSTID=strait-e2e-node$r" "NCCL_SOCKET_IFNAME=lo" "NCCL_DEBUG=INFO"
      "NCCL_DEBUG_SUBSYS=INIT,NET,TUNING,COLL" "NCCL_DEBUG_FILE=$work/$mode.nccl.$r.log"
      "LD_LIBRARY_PATH=$cuda_root/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    )
    if [[ $mode == socket ]]; then
      env+=("NCCL_NET=Socket" "NCCL_NET_PLUGIN=none")
    else
      env+=("NCCL_NET=Strait" "NCCL_NET_PLUGIN=$plugin" "STRAIT_REGION=$region"
        "STRAIT_GATEWAY=${gw_socket[r]}" "STRAIT_SOCKET_IFNAME=lo" "STRAIT_JOB_ID=gpu-e2e")
      [[ $mode == collnet ]] && env+=("NCCL_COLLNET_ENABLE=1")
    fi
    env "${env[@]}" timeout --kill-after=10 "$run_timeout" "$program" --rank "$r" --nranks 4 \
      --device 0 --uid-file "$uid" --sizes "$sizes" --iters "$iters" --warmup "$warmup" \
      --timeout "$run_timeout" >"$work/$mode.out.$r" 2>&1 &
    pids+=($!)
  done
  for r in 0 1 2 3; do
    local st=0
    wait "${pids[r]}" || st=$?
    if ((st != 0)); then
      rc=1
      case $st in
        1) echo "nccl_gpu_e2e: $mode: rank $r computed a WRONG all-reduce result" ;;
        124 | 137) echo "nccl_gpu_e2e: $mode: rank $r did not finish within ${run_timeout}s" ;;
        *) echo "nccl_gpu_e2e: $mode: rank $r failed (exit $st)" ;;
      esac
      tail -15 "$work/$mode.out.$r"
    fi
  done
  stop_gateways
  grep '^RESULT' "$work/$mode.out.0" >"$work/$mode.results" || true
  # What NCCL chose, from rank 0's log: the network and, for CollNet, whether it was used.
  grep -hE 'Using network|TUNER/Strait|CollNet|NET/Strait : (WARN|using)' \
    "$work/$mode.nccl.0.log" 2>/dev/null | head -8 | sed "s/^/  [$mode rank 0] /"
  if ((rc == 0)) && ! grep -q '^CHECK ok' "$work/$mode.out.0"; then
    echo "nccl_gpu_e2e: $mode: rank 0 did not report its check"
    rc=1
  fi
  return $rc
}

if ((gateways_only)); then
  status=0
  for layout in per-region per-rank; do
    if start_gateways "$layout"; then
      for pid in "${gateway_pids[@]}"; do
        kill -0 "$pid" 2>/dev/null || { echo "nccl_gpu_e2e: a gateway exited"; status=1; }
      done
      stop_gateways
    else
      status=1
    fi
  done
  ((status == 0)) && echo "nccl_gpu_e2e: gateways of both layouts started and stopped cleanly"
  exit $status
fi

failed=0
for mode in ${modes//,/ }; do
  echo "== $mode =="
  run_mode "$mode" || failed=1
done

# One table: every mode's bus bandwidth beside the Socket baseline of the same size.
echo
printf '%-8s %12s %12s %12s %12s %10s\n' mode bytes time_us algbw_GB/s busbw_GB/s vs_socket
for mode in ${modes//,/ }; do
  [[ -s $work/$mode.results ]] || { printf '%-8s %12s\n' "$mode" "(no results)"; continue; }
  while read -r _ b t a u; do
    b=${b#bytes=}; t=${t#time_us=}; a=${a#algbw_GBps=}; u=${u#busbw_GBps=}
    base=$(awk -v b="$b" '{ sub("bytes=", "", $2); sub("busbw_GBps=", "", $5);
                           if ($2 == b) print $5 }' "$work/socket.results" 2>/dev/null)
    ratio=-
    [[ -n $base ]] && ratio=$(awk -v x="$u" -v y="$base" 'BEGIN { if (y > 0) printf "%.2fx", x / y }')
    printf '%-8s %12s %12s %12s %12s %10s\n' "$mode" "$b" "$t" "$a" "$u" "$ratio"
  done <"$work/$mode.results"
done
echo "($(date -u '+%Y-%m-%d %H:%M UTC'); 4 ranks on one GPU, loopback; busbw = algbw x 2(n-1)/n)"
if ((failed)); then
  echo "nccl_gpu_e2e: FAILED (see above)"
  exit 1
fi
echo "nccl_gpu_e2e: every mode ran and every all-reduce result was exact"
