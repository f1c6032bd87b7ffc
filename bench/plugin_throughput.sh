#!/usr/bin/env bash
# Point-to-point goodput of libnccl-net-strait.so against its bounds, one table (issue #5's
# benchmark goals).
#
#   bench/plugin_throughput.sh [BUILD_DIR]     # default build/release; about 3 minutes
#   sudo bench/plugin_throughput.sh build/release   # root adds the cross-region case
#
# Cases (CASES selects, default "loopback wan"):
#   loopback  two ranks in one region on 127.0.0.1, STRAIT_NSOCKS sockets per connection, rank 0
#             streaming 64 MiB messages (4 in flight) to rank 1, against iperf3 -P NSOCKS on
#             127.0.0.1 in the same run (by turns, ROUNDS times, best of each). Goal: plugin
#             >= 0.8 x iperf3.
#   wan       (root) strait-wanem, 2 regions, 100 Mbit/s, 100 ms RTT, 0.1% loss; one straitd per
#             region inside its namespace (mutual TLS, adaptive streams), one rank per region
#             behind it; rank 0 streams 8 MiB messages through the tunnel. Goal: >= 0.9 x link.
#             iperf3 -P 4 on the same path is shown beside the link rate (what plain TCP gets
#             there: on a loaded machine the user-space emulator itself loses throughput).
# Each rank is tests/plugins/strait_plugin_node in its "bench" mode (it dlopens the plugin as
# NCCL does; the payload is incompressible). The sender streams for SECONDS_PER + 2 x WARMUP
# seconds; goodput = payload bytes of the messages completed at the receiver from WARMUP seconds
# after its first completion to WARMUP seconds before the sender stops, over that time (both ends
# in steady state, so bytes buffered in the gateways at the start do not inflate it; a window
# that ends when the pipeline drains reads up to 10% high at 100 Mbit/s). SECONDS_PER (20),
# WARMUP (5), NSOCKS (4), LOOP_BYTES (64 MiB), WAN_BYTES (8 MiB), DEPTH (4 sends in flight) and
# STREAMS (the gateways' WAN streams per link: adaptive, as straitd defaults to, or a fixed
# number) override. KEEP_TMP=1 keeps the ranks' and gateways' logs; PLUGIN_NODE_TRACE=1 makes
# the receiving rank log every completion time there (a rate over time); METRICS=1 samples the
# sending gateway's link metrics once a second into metrics.log there.
# The table also shows each rank's CPU seconds (user + system) per second of the run, which says
# where the time goes when a goal is missed. Run it on an idle machine; the load average when it
# started is printed with the table.
set -euo pipefail

BUILD=${1:-build/release}
NODE=$(realpath "$BUILD/tests/plugins/strait_plugin_node" 2>/dev/null || true)
PLUGIN=$(realpath "$BUILD/plugins/nccl/libnccl-net-strait.so" 2>/dev/null || true)
STRAITD=$(realpath "$BUILD/tools/straitd/straitd" 2>/dev/null || true)
WANEM=$(realpath "$BUILD/bench/wanem/strait-wanem" 2>/dev/null || true)
SECONDS_PER=${SECONDS_PER:-20}
WARMUP=${WARMUP:-5}
NSOCKS=${NSOCKS:-4}
LOOP_BYTES=${LOOP_BYTES:-$((64 << 20))}
WAN_BYTES=${WAN_BYTES:-$((8 << 20))}
DEPTH=${DEPTH:-4}
ROUNDS=${ROUNDS:-2}  # loopback: iperf3 and plugin measured by turns this many times, best of each
STREAMS=${STREAMS:-adaptive}  # the gateways' WAN streams: adaptive (straitd's default) or a number
CASES=${CASES:-loopback wan}
NAME=pth
PORT=7412

die() { echo "plugin_throughput: $*" >&2; exit 2; }
[[ -x $NODE && -f $PLUGIN ]] ||
  die "build first: cmake --build $BUILD --target nccl-net-strait strait_plugin_node straitd" \
    "strait-wanem"
command -v iperf3 >/dev/null || die "iperf3 is not installed (apt-get install iperf3)"

TMP=$(mktemp -d /tmp/strait-pth-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [[ -f $TMP/iperf3.pid ]] && kill "$(cat "$TMP/iperf3.pid")" 2>/dev/null || true
  [[ -x $WANEM ]] && "$WANEM" down --name "$NAME" >/dev/null 2>&1 || true
  if [[ -n ${KEEP_TMP:-} ]]; then
    echo "plugin_throughput: logs kept in $TMP" >&2
  else
    rm -rf "$TMP"
  fi
}
trap cleanup EXIT

in_region() { local r=$1; shift; "$WANEM" exec --name "$NAME" "$r" -- "$@"; }

# Runs one bench pair: rank 0 sends, rank 1 receives. $1/$2: command prefixes for ranks 0 and 1
# ("" or "in_region N"); ENV0/ENV1: their STRAIT_* settings; the rest: BYTES SECONDS WARMUP
# DEPTH. Prints "goodput_mbps cpu0_per_s cpu1_per_s", or fails with both ranks' output.
run_pair() {
  local pre0=$1 pre1=$2
  shift 2
  rm -f "$TMP"/in0 "$TMP"/in1 "$TMP"/out0 "$TMP"/out1
  mkfifo "$TMP/in0" "$TMP/in1"
  $pre0 env "${ENV0[@]}" "$NODE" "$PLUGIN" 0 2 bench "$@" <"$TMP/in0" >"$TMP/out0" 2>&1 &
  local p0=$!
  $pre1 env "${ENV1[@]}" "$NODE" "$PLUGIN" 1 2 bench "$@" <"$TMP/in1" >"$TMP/out1" 2>&1 &
  local p1=$!
  exec 5>"$TMP/in0" 6>"$TMP/in1"
  local h0="" h1=""
  for _ in $(seq 300); do
    h0=$(sed -n 's/^HANDLE //p' "$TMP/out0")
    h1=$(sed -n 's/^HANDLE //p' "$TMP/out1")
    [[ -n $h0 && -n $h1 ]] && break
    sleep 0.1
  done
  echo "PEER $h1" >&5
  echo "PEER $h0" >&6
  exec 5>&- 6>&-
  local rc=0
  wait "$p0" || rc=$?
  wait "$p1" || rc=$?
  if [[ $rc != 0 ]] || ! grep -q '^GOODPUT' "$TMP/out1"; then
    echo "plugin_throughput: a bench rank failed:" >&2
    sed 's/^/  rank 0: /' "$TMP/out0" >&2
    sed 's/^/  rank 1: /' "$TMP/out1" >&2
    echo "0 0 0"
    return
  fi
  local g c0 c1
  g=$(awk '/^GOODPUT/ { print $2 }' "$TMP/out1")
  c0=$(awk -v s="$((SECONDS_PER + 2 * WARMUP))" '/^CPU/ { printf "%.2f", $2 / s }' "$TMP/out0")
  c1=$(awk -v s="$((SECONDS_PER + 2 * WARMUP))" '/^CPU/ { printf "%.2f", $2 / s }' "$TMP/out1")
  echo "$g $c0 $c1"
}

# iperf3 -s in the background (optionally `in_region N` first), and its orderly stop: the next
# server binds the same port, so wait until this one is gone.
start_iperf_server() {
  local addr=$1
  shift
  "$@" iperf3 -s -B "$addr" -p "$PORT" -D -I "$TMP/iperf3.pid" >/dev/null
  for _ in $(seq 50); do [[ -s $TMP/iperf3.pid ]] && break; sleep 0.02; done
  sleep 0.2  # iperf3 -D returns before it listens
}
stop_iperf_server() {
  local pid
  pid=$(cat "$TMP/iperf3.pid" 2>/dev/null || true)
  rm -f "$TMP/iperf3.pid"
  [[ -n $pid ]] || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.02; done
}

ROWS=()
row() { ROWS+=("$(printf '%s|' "$@")"); echo "  $*" >&2; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
check() { if awk "BEGIN { exit !($1) }"; then echo PASS; else echo MISS; fi; }
max() { awk -v a="$1" -v b="$2" 'BEGIN { print (a > b ? a : b) }'; }

LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
echo "plugin_throughput: $SECONDS_PER s per measurement after $WARMUP s; load average $LOAD" >&2

if [[ $CASES == *loopback* ]]; then
  # iperf3 and the plugin by turns, ROUNDS times, with the same number of streams on the same
  # interface; the best of each counts (on a shared machine a neighbour's burst then hits one
  # round of one tool, not the comparison).
  ENV0=(STRAIT_SOCKET_IFNAME=lo STRAIT_NSOCKS="$NSOCKS")
  ENV1=("${ENV0[@]}")
  ip=0 g=0 c0=0 c1=0
  for _ in $(seq "$ROUNDS"); do
    start_iperf_server 127.0.0.1
    i=$(iperf3 -c 127.0.0.1 -p "$PORT" -P "$NSOCKS" -t "$SECONDS_PER" -O "$WARMUP" -f m 2>&1 |
        awk '/receiver/ { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") v = $(i - 1) }
             END { print (v == "" ? "0" : v) }')
    stop_iperf_server
    ip=$(max "$ip" "$i")
    read -r pg p0 p1 < <(run_pair "" "" "$LOOP_BYTES" "$((SECONDS_PER + 2 * WARMUP))" "$WARMUP" \
                           "$DEPTH")
    if awk "BEGIN { exit !($pg > $g) }"; then g=$pg c0=$p0 c1=$p1; fi
  done
  row "loopback $((LOOP_BYTES >> 20)) MiB, $NSOCKS socks" "$g" "$ip (iperf3 -P $NSOCKS)" \
    "$(ratio "$g" "$ip")" ">=0.8x iperf3" "$(check "$ip > 0 && $g >= 0.8 * $ip")" "$c0 / $c1"
fi

if [[ $CASES == *wan* ]]; then
  if [[ $(id -u) != 0 ]]; then
    echo "plugin_throughput: skipping the wan case: needs root (strait-wanem)" >&2
  elif [[ ! -x $STRAITD || ! -x $WANEM ]]; then
    echo "plugin_throughput: skipping the wan case: build straitd and strait-wanem in $BUILD" >&2
  else
    command -v openssl >/dev/null || die "openssl is not installed"
    # Throwaway CA and gateway certificates (SAN URI strait://region/<name>), as tests/net does.
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout "$TMP/ca.key" -out "$TMP/ca.pem" -days 2 -subj /CN=pth-ca 2>/dev/null
    for r in r0 r1; do
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$TMP/$r.key" \
        -out "$TMP/$r.csr" -subj "/CN=$r" 2>/dev/null
      printf 'subjectAltName=URI:strait://region/%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n' \
        "$r" >"$TMP/$r.ext"
      openssl x509 -req -in "$TMP/$r.csr" -CA "$TMP/ca.pem" -CAkey "$TMP/ca.key" \
        -set_serial "$RANDOM" -days 2 -out "$TMP/$r.pem" -extfile "$TMP/$r.ext" 2>/dev/null
    done
    "$WANEM" down --name "$NAME" >/dev/null 2>&1 || true
    "$WANEM" up --name "$NAME" --regions 2 --link "100mbit,50ms,loss=0.1%" >/dev/null
    for r in 0 1; do
      p=$((1 - r))
      cat >"$TMP/r$r.toml" <<EOF
region = "r$r"
shard_index = 0
[local]
socket = "$TMP/r$r.sock"
allowed_uids = [$(id -u)]
[wan]
listen = "10.201.$r.1:7600"
transport = "tls"
[tls]
ca = "$TMP/ca.pem"
cert = "$TMP/r$r.pem"
key = "$TMP/r$r.key"
[peers.r$p]
shard_0 = "10.201.$p.1:7600"
EOF
      # The operational HTTP server inside the namespace, for METRICS=1 (sampled below).
      printf '[metrics]\nlisten = "10.201.%s.1:9464"\n' "$r" >>"$TMP/r$r.toml"
      if [[ $STREAMS != adaptive ]]; then
        printf '[link]\nstreams = %s\nadapt_streams = false\n' "$STREAMS" >>"$TMP/r$r.toml"
      fi
      # Not through in_region: $! must be straitd itself (exec replaces strait-wanem with it).
      "$WANEM" exec --name "$NAME" "$r" -- "$STRAITD" --config "$TMP/r$r.toml" \
        >"$TMP/straitd$r.log" 2>&1 &
      PIDS+=($!)
    done
    for r in 0 1; do
      for _ in $(seq 200); do grep -q "straitd ready" "$TMP/straitd$r.log" && break; sleep 0.05; done
      grep -q "straitd ready" "$TMP/straitd$r.log" ||
        die "straitd r$r did not start: $(cat "$TMP/straitd$r.log")"
    done
    # What plain TCP gets on the same emulated path with 4 streams (the gateways start at 1 and
    # grow): shown beside the link rate, it tells a gateway or plugin limit from the path's.
    start_iperf_server 10.201.1.1 in_region 1
    wip=$(in_region 0 iperf3 -c 10.201.1.1 -p "$PORT" -P 4 -t "$SECONDS_PER" -O "$WARMUP" -f m 2>&1 |
          awk '/receiver/ { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") v = $(i - 1) }
               END { print (v == "" ? "0" : v) }')
    stop_iperf_server
    ENV0=(STRAIT_SOCKET_IFNAME=lo STRAIT_REGION=r0 STRAIT_GATEWAY="$TMP/r0.sock")
    ENV1=(STRAIT_SOCKET_IFNAME=lo STRAIT_REGION=r1 STRAIT_GATEWAY="$TMP/r1.sock")
    if [[ -n ${METRICS:-} ]]; then
      # Once a second: the sending gateway's view of its link (streams, goodput estimate, TCP
      # retransmissions, chunks resent, stream failures), into $TMP/metrics.log (KEEP_TMP=1).
      (while sleep 1; do
         echo "t=$(date +%s.%N | cut -c1-14)"
         in_region 0 curl -s http://10.201.0.1:9464/metrics |
           grep -E '^strait_peer_(streams|goodput|tcp_retrans|chunks_resent|stream_fail|sent_bytes)' || true
       done) >"$TMP/metrics.log" 2>&1 &
      PIDS+=($!)
    fi
    read -r g c0 c1 < <(run_pair "in_region 0" "in_region 1" "$WAN_BYTES" \
                          "$((SECONDS_PER + 2 * WARMUP))" "$WARMUP" "$DEPTH")
    row "wan 100mbit 100ms 0.1% $((WAN_BYTES >> 20)) MiB, K=$STREAMS" "$g" \
      "100 (link; iperf3 -P 4: $wip)" "$(ratio "$g" 100)" \
      ">=0.9x link" "$(check "$g >= 90")" "$c0 / $c1"
  fi
fi
echo >&2

{
  echo "case|plugin Mbit/s|baseline Mbit/s|ratio|goal|result|rank cpu/s (send / recv)|"
  printf '%s\n' "${ROWS[@]}"
} | column -t -s '|'
echo "plugin: receiver goodput over about $SECONDS_PER s of steady state ($DEPTH sends in flight);"
echo "iperf3: receiver goodput over $SECONDS_PER s after -O $WARMUP; link: 100 Mbit/s of IP"
echo "(TCP payload is at most 1448/1500 of it). Load average at the start: $LOAD."
