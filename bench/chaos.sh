#!/usr/bin/env bash
# Issue 13's long soak: cross-region all-reduces through the C API under gateway faults, on
# strait-wanem, as one table. The short form is ctest restart_soak_test.
#
#   sudo bench/chaos.sh [--json] [BUILD_DIR]      # default build/release; about 10 minutes
#
# Every scenario: 3 regions on strait-wanem (LINK, default 100 Mbit/s, 20 ms one way), one TLS
# straitd per region and shard, soak_rank processes (tests/api/soak_rank.cc: repeated 4 MiB fp32
# sum all-reduces through strait.hpp, each result checked, element 0 the step number; a failed
# call destroys the comm and creates a new one, as strait.h asks). Each scenario first runs
# BASE_S seconds undisturbed -- the reference throughput of that same configuration, measured in
# the same invocation -- then its faults, SETTLE_S seconds apart once every rank has recovered:
#   kill    CYCLES (10) x: SIGKILL one straitd (regions in turn), restart it 2 s later
#   flap    strait-wanem schedule: every pair down (loss=100%) 3 s; pair 0:1 down 6 s; pair 1:2
#           down 12 s (beyond straitd's link.unreachable_after of 10 s)
#   sskill  `ss -K` of every WAN TCP stream in one region's namespace, regions in turn (5 x)
#   stop    SIGSTOP one straitd for 5 s, then SIGCONT, regions in turn (3 x)
#   lossy   codec int8,ef, 3 kill/restart cycles (fewer when CYCLES is): results checked within a bound, element 0
#           (a whole codec block of labels, so that it survives quantization) to +-0.5, and the
#           result bits compared across every rank at every step ("split" counts steps where
#           they differ)
#   ranks2  2 ranks per region (host backend nranks=2, one straitd per shard), 3 kill/restart
#           cycles (fewer when CYCLES is), shard 0 and 1 in turn
# Per scenario it prints: calls, failed, wrong, mixed, split, partial (step numbers that some
# ranks finished well and others failed: their replicas part ways; reported, not judged), hangs
# (rank processes that did not exit by themselves, or whose watchdog fired), recovery after
# each fault (the first good step of the slowest rank after the fault ended, which includes one
# step's time: max and median over the faults), throughput between
# faults (4 MiB per step over the step-to-step time of consecutive good steps outside every fault
# and its recovery, mean over ranks) against the scenario's undisturbed lead-in (goal >= 0.9),
# and the machine's load (uptime's 1-minute average at the end). --json prints one JSON object
# instead (every fault's recovery included).
# SCENARIOS ("kill flap sskill stop lossy ranks2"), CYCLES (10), BASE_S (20), SETTLE_S (8),
# RECOVER_S (60: how long to wait for every rank to recover before the next fault anyway),
# COUNT (1048576 fp32), LINK (100mbit,20ms), TIMEOUT_MS (10000: the comms' timeout_ms), RTO_MAX
# (straitd's link.tcp_rto_max, 1s; 120s is the kernel's uncapped backoff, for a baseline) override.
# Rank logs stay in the printed directory when KEEP=1.
# Exit code: 0 when no scenario had a wrong, mixed or split result or a hang (a missed recovery or
# throughput goal still exits 0), 1 otherwise, 2 for a setup problem.
set -Eeuo pipefail
trap 'echo "chaos: stopped: line $LINENO: $BASH_COMMAND exited $?" >&2' ERR

JSON=0
if [[ ${1:-} == --json ]]; then JSON=1; shift; fi
BUILD=${1:-build/release}
SCENARIOS=${SCENARIOS:-kill flap sskill stop lossy ranks2}
CYCLES=${CYCLES:-10}
BASE_S=${BASE_S:-20}
SETTLE_S=${SETTLE_S:-8}
RECOVER_S=${RECOVER_S:-60}
COUNT=${COUNT:-1048576}
LINK=${LINK:-100mbit,20ms}
TIMEOUT_MS=${TIMEOUT_MS:-10000}
RTO_MAX=${RTO_MAX:-1s}
KEEP=${KEEP:-0}
NAME=chaos
REGIONS=3
PORT_BASE=7600

die() { echo "chaos: $*" >&2; exit 2; }
[[ $(id -u) == 0 ]] || die "needs root (strait-wanem creates network namespaces)"
WANEM=$(realpath "$BUILD/bench/wanem/strait-wanem" 2>/dev/null) || true
STRAITD=$(realpath "$BUILD/tools/straitd/straitd" 2>/dev/null) || true
RANK=$(realpath "$BUILD/tests/api/soak_rank" 2>/dev/null) || true
[[ -x ${WANEM:-} && -x ${STRAITD:-} && -x ${RANK:-} ]] ||
  die "build strait-wanem, straitd and soak_rank in $BUILD first (cmake --build $BUILD --target strait-wanem straitd soak_rank)"
command -v python3 >/dev/null || die "python3 is needed for the table"
command -v openssl >/dev/null || die "openssl is needed for the throwaway TLS certificates"
grep -q Release "$BUILD/CMakeCache.txt" 2>/dev/null ||
  echo "chaos: warning: $BUILD is not a Release build; throughput and recovery will read slow" >&2

TMP=$(mktemp -d /tmp/strait-chaos-XXXXXX)
DPIDS=()  # straitd per slot (region * shards + shard)
RPIDS=()  # soak_rank processes
cleanup() {
  for p in "${RPIDS[@]}" "${DPIDS[@]}"; do
    [[ $p -gt 0 ]] && { kill -CONT "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; }
  done
  "$WANEM" down --name "$NAME" >/dev/null 2>&1 || true
  if [[ $KEEP == 1 ]]; then echo "chaos: logs kept in $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

now_ms() { date +%s%3N; }
log() { echo "chaos: $*" >&2; }

# Throwaway CA and one certificate per (region, shard): SAN URI strait://region/r<i>, as
# tests/net/test_certs.cc makes them.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$TMP/ca.key" \
  -out "$TMP/ca.pem" -days 2 -subj /CN=chaos-ca 2>/dev/null
make_cert() {  # region shard
  local n="r$1_$2"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$TMP/$n.key" \
    -out "$TMP/$n.csr" -subj "/CN=$n" 2>/dev/null
  printf 'subjectAltName=URI:strait://region/r%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n' \
    "$1" >"$TMP/$n.ext"
  openssl x509 -req -in "$TMP/$n.csr" -CA "$TMP/ca.pem" -CAkey "$TMP/ca.key" \
    -set_serial "$RANDOM$RANDOM" -days 2 -out "$TMP/$n.pem" -extfile "$TMP/$n.ext" 2>/dev/null
}
for r in $(seq 0 $((REGIONS - 1))); do make_cert "$r" 0; make_cert "$r" 1; done

# The straitd config of (region, shard), as tests/gateway/wan_cluster.cc writes it.
write_config() {  # dir region shard
  local d=$1 r=$2 i=$3 p
  {
    echo "region = \"r$r\""
    echo "shard_index = $i"
    echo "[local]"
    echo "socket = \"$d/r${r}_$i.sock\""
    echo "allowed_uids = [0]"
    echo "[wan]"
    echo "listen = \"10.201.$r.1:$((PORT_BASE + i))\""
    echo "transport = \"tls\""
    echo "[tls]"
    echo "ca = \"$TMP/ca.pem\""
    echo "cert = \"$TMP/r${r}_$i.pem\""
    echo "key = \"$TMP/r${r}_$i.key\""
    for p in $(seq 0 $((REGIONS - 1))); do
      [[ $p == "$r" ]] && continue
      echo "[peers.r$p]"
      echo "shard_$i = \"10.201.$p.1:$((PORT_BASE + i))\""
    done
    echo "[link]"
    echo "streams = 2"
    echo "unreachable_after = \"10s\""
    echo "tcp_rto_max = \"$RTO_MAX\""
    echo "[policy]"
    echo 'allowed_codecs = ["none", "zstd", "int8", "int4", "fp8"]'
    echo "max_relative_error = 1.0"
    echo 'min_lossy_bytes = "0B"'
    echo "[allreduce]"
    echo 'deadline = "8s"'
    echo 'shutdown_grace = "2s"'
  } >"$d/r${r}_$i.toml"
}

SHARDS=1
SDIR=
# Starts straitd (region, shard) in its namespace; its stdout is appended to, so a restart adds
# one more "straitd ready" line, which wait_ready counts.
start_daemon() {  # region shard
  local r=$1 i=$2 slot=$(($1 * SHARDS + $2))
  "$WANEM" exec --name "$NAME" "$r" -- "$STRAITD" --config "$SDIR/r${r}_$i.toml" \
    >>"$SDIR/r${r}_$i.out" 2>>"$SDIR/r${r}_$i.err" &
  DPIDS[$slot]=$!
  STARTS[$slot]=$((${STARTS[$slot]:-0} + 1))
}
wait_ready() {  # region shard
  local r=$1 i=$2 slot=$(($1 * SHARDS + $2)) n
  for _ in $(seq 600); do
    n=$(grep -c "straitd ready" "$SDIR/r${r}_$i.out" 2>/dev/null || true)
    [[ ${n:-0} -ge ${STARTS[$slot]} ]] && return 0
    kill -0 "${DPIDS[$slot]}" 2>/dev/null || die "straitd r$r.$i exited: $(tail -5 "$SDIR/r${r}_$i.err")"
    sleep 0.05
  done
  die "straitd r$r.$i not ready in 30 s: $(tail -5 "$SDIR/r${r}_$i.err")"
}
kill_daemon() {  # region shard
  local slot=$(($1 * SHARDS + $2))
  kill -9 "${DPIDS[$slot]}" 2>/dev/null || true
  wait "${DPIDS[$slot]}" 2>/dev/null || true
  DPIDS[$slot]=0
}

# Whether every rank has a good step that ended after $1 (Unix ms).
all_recovered() {
  local f
  for f in "$SDIR"/rank_*.log; do
    awk -v t="$1" '$1 == "step" && $5 == "ok" && $4 > t { found = 1; exit } END { exit !found }' \
      "$f" || return 1
  done
}
# Waits (up to RECOVER_S) for every rank to recover after $1; then SETTLE_S of quiet.
recover_and_settle() {
  local until=$(($(now_ms) + RECOVER_S * 1000))
  while ! all_recovered "$1" && [[ $(now_ms) -lt $until ]]; do sleep 0.2; done
  sleep "$SETTLE_S"
}
fault() { echo "$1 $2 $3 $4" >>"$SDIR/faults"; }  # kind target start_ms end_ms

# One scenario: name, compression, shards (ranks per region), schedule file or "".
run_scenario() {
  local scn=$1 comp=$2 shards=$3 sched=$4 r i lossy=() t0 t1 k
  SHARDS=$shards
  SDIR=$TMP/$scn
  mkdir -p "$SDIR"
  : >"$SDIR/faults"
  DPIDS=(); RPIDS=(); STARTS=()
  [[ $comp == none ]] || lossy=(--lossy)
  log "$scn: strait-wanem $LINK, $REGIONS regions x $shards rank(s), compression $comp, link.tcp_rto_max $RTO_MAX"
  "$WANEM" down --name "$NAME" >/dev/null 2>&1 || true
  local up=(up --name "$NAME" --regions "$REGIONS" --link "$LINK")
  [[ -n $sched ]] && up+=(--schedule "$sched")
  "$WANEM" "${up[@]}" >/dev/null
  echo "$(now_ms)" >"$SDIR/wanem_start"
  for r in $(seq 0 $((REGIONS - 1))); do
    for i in $(seq 0 $((shards - 1))); do write_config "$SDIR" "$r" "$i"; start_daemon "$r" "$i"; done
  done
  for r in $(seq 0 $((REGIONS - 1))); do
    for i in $(seq 0 $((shards - 1))); do wait_ready "$r" "$i"; done
  done
  for r in $(seq 0 $((REGIONS - 1))); do
    for i in $(seq 0 $((shards - 1))); do
      "$WANEM" exec --name "$NAME" "$r" -- "$RANK" --region "$r" --regions "$REGIONS" \
        --rank "$i" --nranks "$shards" --root "10.201.$r.1:29400" \
        --gateway "$SDIR/r${r}_$i.sock" --job "chaos-$scn" --compression "$comp" \
        --count "$COUNT" --timeout-ms "$TIMEOUT_MS" --duration-s 1800 \
        --stop-file "$SDIR/stop" --recovery-deadline-s 120 "${lossy[@]}" \
        --out "$SDIR/rank_r${r}_$i" >"$SDIR/rank_r${r}_$i.stderr" 2>&1 &
      RPIDS+=($!)
    done
  done
  echo "$(now_ms)" >"$SDIR/lead_start"
  sleep "$BASE_S"
  echo "$(now_ms)" >"$SDIR/lead_end"

  case $scn in
    kill|lossy|ranks2)
      local n=$CYCLES
      [[ $scn == kill || $CYCLES -lt 3 ]] || n=3
      for k in $(seq 0 $((n - 1))); do
        r=$((k % REGIONS)); i=$(((k / REGIONS) % shards))
        [[ $scn == ranks2 ]] && i=$((k % shards))
        t0=$(now_ms)
        kill_daemon "$r" "$i"
        sleep 2
        t1=$(now_ms)
        start_daemon "$r" "$i"
        wait_ready "$r" "$i"
        fault kill "r$r.$i" "$t0" "$t1"
        log "$scn: cycle $((k + 1))/$n: straitd r$r.$i killed, restarted 2 s later"
        recover_and_settle "$t1"
      done ;;
    flap)
      # The schedule's times count from the emulator's start; wait for each flap's end.
      local w
      w=$(cat "$SDIR/wanem_start")
      while read -r kind target off len; do
        t0=$((w + off * 1000)); t1=$((t0 + len * 1000))
        while [[ $(now_ms) -lt $t1 ]]; do sleep 0.2; done
        fault "$kind" "$target" "$t0" "$t1"
        log "$scn: $target down ${len} s"
        recover_and_settle "$t1"
      done <"$SDIR/flaps" ;;
    sskill)
      for k in 0 1 2 3 4; do
        r=$((k % REGIONS))
        t0=$(now_ms)
        # Inside region r only, and only its WAN streams (to the other regions' 10.201.x.1).
        "$WANEM" exec --name "$NAME" "$r" -- ss -K -t dst 10.201.0.0/16 and not dst "10.201.$r.1" \
          >"$SDIR/ss_$k.out" 2>&1 || log "ss -K failed: $(tail -1 "$SDIR/ss_$k.out")"
        t1=$(now_ms)
        fault sskill "r$r:$(grep -c ESTAB "$SDIR/ss_$k.out" || true)streams" "$t0" "$t1"
        log "$scn: killed $(grep -c ESTAB "$SDIR/ss_$k.out" || true) WAN TCP streams in r$r"
        recover_and_settle "$t1"
      done ;;
    stop)
      for r in 0 1 2; do
        t0=$(now_ms)
        # A daemon that died on its own is a finding, not a reason to stop the whole run.
        kill -STOP "${DPIDS[$((r * SHARDS))]}" || log "$scn: straitd r$r.0 is gone (see its log)"
        sleep 5
        kill -CONT "${DPIDS[$((r * SHARDS))]}" || true
        t1=$(now_ms)
        fault stop "r$r.0" "$t0" "$t1"
        log "$scn: straitd r$r.0 stopped 5 s"
        recover_and_settle "$t1"
      done ;;
  esac
  echo "$(now_ms)" >"$SDIR/faults_end"

  # Every rank stops before the same step, a little past the furthest one logged: +3, because a
  # rank may finish the step it is in (not logged yet) and start the next before the file
  # appears (with +2 one rank stopped while two ran a last step alone and failed it).
  local last
  last=$(awk '$1 == "step" && $2 > m { m = $2 } END { print m + 0 }' "$SDIR"/rank_*.log)
  echo $((last + 3)) >"$SDIR/stop.tmp" && mv "$SDIR/stop.tmp" "$SDIR/stop"
  local until=$(($(now_ms) + 2 * TIMEOUT_MS + 30000)) p
  : >"$SDIR/hung"
  for p in "${RPIDS[@]}"; do
    while kill -0 "$p" 2>/dev/null && [[ $(now_ms) -lt $until ]]; do sleep 0.2; done
    if kill -0 "$p" 2>/dev/null; then
      echo "$p" >>"$SDIR/hung"
      kill -9 "$p" 2>/dev/null || true
    fi
    wait "$p" 2>/dev/null || true
  done
  RPIDS=()
  for p in "${DPIDS[@]}"; do [[ $p -gt 0 ]] && { kill -CONT "$p"; kill "$p"; wait "$p"; } 2>/dev/null || true; done
  DPIDS=()
  "$WANEM" down --name "$NAME" >/dev/null
  uptime >"$SDIR/uptime"
  echo "$scn $comp $shards" >"$SDIR/scenario"
}

log "$BUILD, scenarios: $SCENARIOS; logs in $TMP"
for scn in $SCENARIOS; do
  case $scn in
    kill) run_scenario kill none 1 "" ;;
    flap)
      mkdir -p "$TMP/flap"
      # Offsets from the emulator's start: the lead-in (plus start-up) comes first.
      a=$((BASE_S + 10)); b=$((a + 25)); c=$((b + 30))
      printf '%s\n' "${a}s * loss=100%" "$((a + 3))s * loss=0" "${b}s 0:1 loss=100%" \
        "$((b + 6))s 0:1 loss=0" "${c}s 1:2 loss=100%" "$((c + 12))s 1:2 loss=0" >"$TMP/flap.sched"
      printf '%s\n' "flap all $a 3" "flap 0:1 $b 6" "flap 1:2 $c 12" >"$TMP/flap/flaps"
      run_scenario flap none 1 "$TMP/flap.sched" ;;
    sskill) run_scenario sskill none 1 "" ;;
    stop) run_scenario stop none 1 "" ;;
    lossy) run_scenario lossy int8,ef 1 "" ;;
    ranks2) run_scenario ranks2 none 2 "" ;;
    *) die "unknown scenario '$scn' (kill flap sskill stop lossy ranks2)" ;;
  esac
done

rc=0
# --json carries the fields every Strait tool's report has (tool, version, timestamp).
VERSION=$("$STRAITD" --version | awk '{print $2}')
python3 - "$TMP" "$JSON" "$COUNT" "$SCENARIOS" "$VERSION" <<'EOF' || rc=$?
import datetime, glob, json, os, statistics, sys
tmp, as_json, count, scenarios = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4].split()
version = sys.argv[5]
tensor_mib = count * 4 / 2**20
out, bad = [], False

def steps(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) >= 7 and p[0] == "step":
                rows.append({"step": int(p[1]), "t0": int(p[2]), "t1": int(p[3]), "cls": p[4],
                             "hash": p[6], "rest": " ".join(p[7:])})
    return rows

def first_refusal(path):
    # The message of a rank's first failed comm creation ("init START END failed CODE MESSAGE").
    with open(path) as f:
        for line in f:
            p = line.split(maxsplit=5)
            if len(p) == 6 and p[0] == "init" and p[3] == "failed":
                return p[5].strip()
    return ""

def summary(path):
    kv = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                k, _, v = line.strip().partition(" ")
                kv[k] = v
    return kv

def throughput(rows, windows):
    # MiB/s of tensor over the step-to-step times of consecutive good steps inside a window.
    gaps = []
    for a, b in zip(rows, rows[1:]):
        if a["cls"] == b["cls"] == "ok" and b["step"] == a["step"] + 1 and \
           any(w0 <= a["t1"] and b["t1"] <= w1 for w0, w1 in windows):
            gaps.append(b["t1"] - a["t1"])
    return (tensor_mib / (statistics.mean(gaps) / 1e3), len(gaps)) if gaps else (0.0, 0)

for scn in scenarios:
    d = os.path.join(tmp, scn)
    name, comp, shards = open(os.path.join(d, "scenario")).read().split()
    ranks = sorted(glob.glob(os.path.join(d, "rank_*.log")))
    logs = {os.path.basename(r)[5:-4]: steps(r) for r in ranks}
    sums = {k: summary(os.path.join(d, "rank_" + k + ".summary")) for k in logs}
    hung = [l for l in open(os.path.join(d, "hung")).read().split() if l]
    faults = []
    for line in open(os.path.join(d, "faults")):
        kind, target, t0, t1 = line.split()
        faults.append({"kind": kind, "target": target, "start_ms": int(t0), "end_ms": int(t1)})
    for f in faults:
        firsts = []
        for rows in logs.values():
            ok = [r["t1"] for r in rows if r["cls"] == "ok" and r["t1"] > f["end_ms"]]
            firsts.append(ok[0] if ok else None)
        f["recovery_ms"] = None if None in firsts else max(firsts) - f["end_ms"]
    rec = [f["recovery_ms"] for f in faults if f["recovery_ms"] is not None]
    unrecovered = sum(1 for f in faults if f["recovery_ms"] is None)
    lead = (int(open(os.path.join(d, "lead_start")).read()), int(open(os.path.join(d, "lead_end")).read()))
    end = int(open(os.path.join(d, "faults_end")).read())
    # Between faults: from each fault's recovery (all ranks good again) to the next fault's start.
    quiet, t = [], lead[1]
    for f in faults:
        quiet.append((t, f["start_ms"]))
        t = f["end_ms"] + (f["recovery_ms"] if f["recovery_ms"] is not None else 10**9)
    quiet.append((t, end))
    base, between = [], []
    for rows in logs.values():
        # The lead-in's first steps are the links' start-up: skip the first 3.
        b, nb = throughput(rows[3:], [lead])
        q, nq = throughput(rows, quiet)
        base.append(b); between.append(q)
    base_mbs = statistics.mean(base) if base else 0.0
    between_mbs = statistics.mean(between) if between else 0.0
    # Lossy runs: every rank's result bits at every step that all of them finished well.
    split = 0
    if comp != "none":
        by_step = {}
        for rows in logs.values():
            for r in rows:
                if r["cls"] == "ok":
                    by_step.setdefault(r["step"], []).append(r["hash"])
        split = sum(1 for h in by_step.values() if len(h) == len(logs) and len(set(h)) > 1)
    # Steps that some ranks finished well while others failed them: not wrong in itself, but the
    # ranks' replicas part ways there (one applied the step, another did not).
    classes = {}
    for rows in logs.values():
        for r in rows:
            classes.setdefault(r["step"], []).append(r["cls"])
    partial = sum(1 for c in classes.values() if "ok" in c and "failed" in c)
    n = lambda k: sum(int(s.get(k, 0) or 0) for s in sums.values())
    hangs = len(hung) + n("hangs") + sum(1 for s in sums.values() if not s)
    # Ranks that stopped for good because no new comm could be made (soak_rank's exit no_comm),
    # and the first refusal they saw: the job cannot go on there, whatever the other columns say.
    gave_up = sorted(k for k, s in sums.items() if s.get("exit") == "no_comm")
    refusal = next((m for k in gave_up
                    if (m := first_refusal(os.path.join(d, "rank_" + k + ".log")))), "")
    odd = []
    for k, rows in logs.items():
        for r in rows:
            if r["cls"] in ("wrong", "mixed") and len(odd) < 5:
                odd.append(f"{k} step {r['step']} {r['cls']} {r['rest'][:160]}")
    row = {"scenario": name, "compression": comp, "ranks_per_region": int(shards),
           "calls": n("calls"), "ok": n("ok"), "failed": n("failed"), "wrong": n("wrong"),
           "mixed": n("mixed"), "split": split, "partial": partial, "hangs": hangs, "faults": faults,
           "unrecovered": unrecovered, "gave_up": gave_up, "refusal": refusal,
           "ranks": len(logs),
           "recovery_max_ms": max(rec) if rec else None,
           "recovery_median_ms": statistics.median(rec) if rec else None,
           "baseline_mib_s": round(base_mbs, 2), "between_faults_mib_s": round(between_mbs, 2),
           "throughput_ratio": round(between_mbs / base_mbs, 3) if base_mbs else None,
           "uptime": open(os.path.join(d, "uptime")).read().strip(), "odd": odd}
    bad = bad or row["wrong"] or row["mixed"] or split or hangs
    out.append(row)

if as_json:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(json.dumps({"tool": "chaos.sh", "version": version, "timestamp": now,
                      "tensor_mib": tensor_mib, "scenarios": out}, indent=1))
else:
    head = ["scenario", "calls", "failed", "wrong", "mixed", "split", "partial", "hangs", "faults",
            "recovery max/median s", "MiB/s between / undisturbed", "ratio", "goal", "load 1m"]
    table = [head]
    for r in out:
        rmax = "-" if r["recovery_max_ms"] is None else f"{r['recovery_max_ms'] / 1e3:.1f}"
        rmed = "-" if r["recovery_median_ms"] is None else f"{r['recovery_median_ms'] / 1e3:.1f}"
        ratio = r["throughput_ratio"]
        goal_ok = (ratio is not None and ratio >= 0.9 and not r["unrecovered"] and
                   (r["recovery_max_ms"] or 0) <= 5000)
        table.append([f"{r['scenario']} ({r['compression']}, {r['ranks_per_region']}/region)",
                      str(r["calls"]), str(r["failed"]), str(r["wrong"]), str(r["mixed"]),
                      str(r["split"]), str(r["partial"]), str(r["hangs"]),
                      f"{len(r['faults'])}" + (f" ({r['unrecovered']} never)" if r["unrecovered"] else ""),
                      f"{rmax} / {rmed}",
                      f"{r['between_faults_mib_s']:.2f} / {r['baseline_mib_s']:.2f}",
                      "-" if ratio is None else f"{ratio:.2f}",
                      "PASS" if goal_ok else "MISS",
                      r["uptime"].split("load average:")[-1].split(",")[0].strip()])
    w = [max(len(t[i]) for t in table) for i in range(len(head))]
    print(f"# chaos: 3 regions on strait-wanem, {tensor_mib:g} MiB fp32 all-reduces per step; "
          "goal: 0 wrong/mixed/split/hangs, recovery <= 5 s, throughput >= 0.9x undisturbed")
    for t in table:
        print("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(t)))
    for r in out:
        for o in r["odd"]:
            print(f"# {r['scenario']}: {o}")
        if r["gave_up"]:
            print(f"# {r['scenario']}: {len(r['gave_up'])} of {r['ranks']} ranks gave up (no new "
                  f"comm within the recovery deadline), the first refusal: {r['refusal'][:700]}")
sys.exit(1 if bad else 0)
EOF
exit "$rc"
