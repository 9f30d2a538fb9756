#!/usr/bin/env bash
# bench/syscalls.sh — system calls per request of one or more pdgate builds, counted by
# `strace -c -f` on the same HTTP SGLang mocks (role both, canned), non-streamed small chat.
#
# Counts do not move with the machine's load the way CPU times do, so an A/B of two builds that
# differ by a syscall or a wake-up shows here when the CPU figures of run.sh are within noise.
# strace slows the gateway several-fold: read the counts, not the req/s.
#
#   BIN_DIR=/tmp/pdgate-head PDGATE_ALT='before=/tmp/pdgate-before/pdgate' bench/syscalls.sh
#
# Knobs: BIN_DIR / SKIP_BUILD / CARGO_TARGET_DIR (as run.sh; `pdgate` there is target `pdgate`),
# PDGATE_ALT ("NAME=PATH …", more builds), CONCURRENCY (default 1,64), DURATION (3 s per point),
# PORT_BASE (default 24600), OUT (default bench/results; writes syscalls.md, logs/ under it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results}
PORT_BASE=${PORT_BASE:-24600}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN_DIR:-$CARGO_TARGET_DIR/release}
PDGATE_ALT=${PDGATE_ALT:-}
CONCURRENCY=${CONCURRENCY:-1,64}
DURATION=${DURATION:-3}

LOG_TAG=syscalls
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

command -v strace >/dev/null || die "strace not installed (apt-get install strace)"
build_binaries
mkdir -p "$OUT/logs"
http=http://127.0.0.1
for i in 2 3; do
  port_free $((PORT_BASE + i)) || die "port $((PORT_BASE + i)) is busy (set PORT_BASE)"
  "$BIN/mock-engine" --engine sglang --role both --host 127.0.0.1 --port $((PORT_BASE + i)) \
    --ttft-ms 0 --itl-ms 0 --max-model-len 1000000 --max-running-requests 100000 \
    >"$OUT/logs/syscalls-mock-$i.log" 2>&1 &
  PIDS+=("$!")
  wait_http "$http:$((PORT_BASE + i))/health" || die "mock did not start"
done

md=$OUT/syscalls.md
{
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg); builds: pdgate=$BIN/pdgate $PDGATE_ALT"
  echo
  echo "| build | c | requests | syscalls / request | the largest, per request |"
  echo "|---|---:|---:|---:|---|"
} >"$md"
port=$((PORT_BASE + 10))
for build in "pdgate=$BIN/pdgate" $PDGATE_ALT; do
  name=${build%%=*}
  GW_EXE=${build#*=} start_pdgate "syscalls-$name" $port round_robin \
    "$(worker_yaml "$http:$((PORT_BASE + 2))" prefill $((PORT_BASE + 4)); worker_yaml "$http:$((PORT_BASE + 3))" decode)"
  for c in ${CONCURRENCY//,/ }; do
    trace=$OUT/logs/syscalls-$name-c$c.strace
    strace -c -f -p "$GW_PID" -o "$trace" 2>/dev/null &
    st=$!
    sleep 1 # strace attaches to every thread before the load starts
    "$BIN/pdgate-bench" --threads 2 sweep --target "$name=$http:$port" --concurrency "$c" \
      --prompt-bytes 1024 --stream off --duration "$DURATION" --warmup 0.01 \
      --json "$OUT/logs/syscalls-$name-c$c.json" --markdown /dev/null 2>/dev/null
    kill -INT "$st"
    wait "$st" || true
    # Every request that completed, including the few of the warm-up and the tail.
    n=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$OUT/logs/syscalls-$name-c$c.json" | tail -1)
    rm -f "$OUT/logs/syscalls-$name-c$c.json"
    awk -v n="$n" -v name="$name" -v c="$c" '
      $1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" { calls[$NF] = $4; total += $4 }
      END {
        top = ""
        for (k = 0; k < 5; k++) {
          best = ""; for (s in calls) if (best == "" || calls[s] > calls[best]) best = s
          if (best == "" || calls[best] / n < 0.05) break
          top = top sprintf("%s%s %.2f", top == "" ? "" : ", ", best, calls[best] / n); delete calls[best]
        }
        printf "| %s | %d | %d | %.2f | %s |\n", name, c, n, total / n, top
      }' "$trace" >>"$md"
  done
  kill "$GW_PID" 2>/dev/null || true
  port=$((port + 2))
done
echo >>"$md"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$md"
cat "$md"
