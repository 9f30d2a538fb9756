#!/usr/bin/env bash
# bench/allocs.sh — heap allocation calls per request of one or more pdgate builds, counted by
# heaptrack on the canned-fast engines (run.sh's), small chat, non-streamed and streamed.
#
# Like syscalls.sh, a count that does not move with the machine's load: an A/B of two builds
# that differ by an allocation or two shows here when together.sh's CPU ratios are within noise.
# Each build runs twice under heaptrack: once started and stopped with no load (its start-up and
# shutdown), once with the load; per request = (loaded − idle) ÷ requests served. heaptrack slows
# the gateway several-fold: read the counts, not the req/s.
#
#   PDGATE_ALT='before=/tmp/pdgate-before/pdgate' bench/allocs.sh
#
# Counted are the calls that reach glibc's malloc family: blocks of 1–16 KiB that pdgate's own
# per-thread cache (src/blocks.rs) serves are not calls, as in production. The gateway is
# started with GLIBC_TUNABLES already set to pdgate's own values, so it does not re-execute
# itself (heaptrack would follow only the first process).
#
# Knobs: BIN_DIR / SKIP_BUILD / CARGO_TARGET_DIR (as run.sh), PDGATE_ALT ("NAME=PATH …", more
# builds), CONCURRENCY (default 16), STREAM (default off,on), DURATION (4 s per point),
# PORT_BASE (default 24800), OUT (default bench/results; writes allocs.md, logs/ under it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results}
PORT_BASE=${PORT_BASE:-24800}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN_DIR:-$CARGO_TARGET_DIR/release}
PDGATE_ALT=${PDGATE_ALT:-}
CONCURRENCY=${CONCURRENCY:-16}
STREAM=${STREAM:-off,on}
DURATION=${DURATION:-4}

LOG_TAG=allocs
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

command -v heaptrack >/dev/null || die "heaptrack not installed (apt-get install heaptrack)"
build_binaries
mkdir -p "$OUT/logs"
http=http://127.0.0.1
start_canned_pair allocs

# traced NAME EXE PORT [LOAD_ARGS…]: runs EXE under heaptrack (load when LOAD_ARGS are given),
# stops it, and prints "CALLS REQUESTS".
traced() {
  local name=$1 exe=$2 port=$3
  shift 3
  local wrapper=$OUT/logs/allocs-$name-heaptrack.sh data=$OUT/logs/allocs-$name
  rm -f "$data".*
  printf '#!/bin/sh\nexport GLIBC_TUNABLES=%s\nexec heaptrack -o %s %s "$@"\n' \
    "$PDGATE_TUNABLES" "$data" "$exe" >"$wrapper"
  chmod +x "$wrapper"
  GW_EXE=$wrapper start_pdgate "allocs-$name" "$port" round_robin "$workers"
  local requests=0
  if (($# > 0)); then
    "$BIN/pdgate-bench" --threads 1 sweep --target "$name=$http:$port" "$@" \
      --prompt-bytes 1024 --duration "$DURATION" --warmup 0.01 \
      --json "$data.json" --markdown /dev/null 2>/dev/null
    requests=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$data.json" | tail -1)
  fi
  # heaptrack's script runs the gateway as its child: the signal goes to both.
  pkill -INT -P "$GW_PID" 2>/dev/null || true
  kill -INT "$GW_PID" 2>/dev/null || true
  wait "$GW_PID" 2>/dev/null || true
  local file
  for _ in $(seq 1 100); do
    file=$(ls "$data".*zst "$data".*gz 2>/dev/null | head -1 || true)
    [[ -n $file ]] && break
    sleep 0.1
  done
  [[ -n $file ]] || die "no heaptrack data for $name"
  local calls
  calls=$(heaptrack_print "$file" 2>/dev/null | sed -n 's/^calls to allocation functions: \([0-9]*\).*/\1/p')
  echo "$calls $requests"
}

md=$OUT/allocs.md
{
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg); builds: pdgate=$BIN/pdgate $PDGATE_ALT"
  echo
  echo "| build | stream | c | requests | allocation calls / request | idle start + stop (calls) |"
  echo "|---|---|---:|---:|---:|---:|"
} >"$md"
port=$((PORT_BASE + 10))
for build in "pdgate=$BIN/pdgate" $PDGATE_ALT; do
  name=${build%%=*}
  exe=${build#*=}
  read -r idle _ < <(traced "$name-idle" "$exe" $port)
  port=$((port + 2))
  for s in ${STREAM//,/ }; do
    for c in ${CONCURRENCY//,/ }; do
      read -r calls n < <(traced "$name-$s-c$c" "$exe" $port --concurrency "$c" --stream "$s")
      port=$((port + 2))
      awk -v name="$name" -v s="$s" -v c="$c" -v n="$n" -v calls="$calls" -v idle="$idle" \
        'BEGIN { printf "| %s | %s | %d | %d | %.1f | %d |\n", name, s, c, n, (calls - idle) / n, idle }' >>"$md"
    done
  done
done
echo >>"$md"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$md"
cat "$md"
