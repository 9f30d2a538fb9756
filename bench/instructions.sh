#!/usr/bin/env bash
# bench/instructions.sh — user-space instructions per request of one or more pdgate builds,
# counted by valgrind's callgrind on the canned-fast engines (run.sh's), small chat, non-streamed
# and streamed; with TRANSPORT=grpc, on two gRPC SGLang mocks answering at once (run.sh's
# grpc-canned engines), the gateway tokenizing with `pdgate-bench write-model`'s model.
#
# Like allocs.sh and syscalls.sh, a count that does not move with the machine's load: a change
# worth 2–3% of a request's CPU is inside the noise of a CPU-time A/B on this VM (run.sh's rounds
# differ by ±10%), and shows here. Each build runs under callgrind; the counters are zeroed after
# a warm-up load and dumped after the measured one, so start-up is not counted. The kernel's
# share (the sends and reads) is not in it: read it beside cost-split.sh. callgrind slows the
# gateway ~50-fold: read the counts, not the req/s.
#
#   PDGATE_ALT='before=/tmp/pdgate-before/pdgate' bench/instructions.sh
#
# Knobs: BIN_DIR / SKIP_BUILD / CARGO_TARGET_DIR (as run.sh), PDGATE_ALT ("NAME=PATH …", more
# builds), FLOORS ("pingora-floor floor": count the floors of run.sh as well, after the builds;
# HTTP only), TRANSPORT (http, the default, or grpc), CONCURRENCY (default 16), STREAM (default
# off,on), DURATION (8 s per point), PORT_BASE (default 25000), OUT (default bench/results;
# writes instructions.md — instructions-grpc.md with TRANSPORT=grpc — and logs/ under it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results}
PORT_BASE=${PORT_BASE:-25000}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN_DIR:-$CARGO_TARGET_DIR/release}
PDGATE_ALT=${PDGATE_ALT:-}
CONCURRENCY=${CONCURRENCY:-16}
STREAM=${STREAM:-off,on}
DURATION=${DURATION:-8}
TRANSPORT=${TRANSPORT:-http}
FLOORS=${FLOORS:-}

LOG_TAG=instructions
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

command -v valgrind >/dev/null || die "valgrind not installed (apt-get install valgrind)"
build_binaries
pgo_build
mkdir -p "$OUT/logs"
http=http://127.0.0.1
extra=
case $TRANSPORT in
  http) start_canned_pair instructions ;;
  grpc)
    start_grpc_pair instructions
    extra=$model_yaml
    ;;
  *) die "TRANSPORT is http or grpc, not $TRANSPORT" ;;
esac

# load SECONDS JSON: the current build's gateway ($name on $port) loaded with stream $s.
load() {
  "$BIN/pdgate-bench" --threads 1 sweep --target "$name=$http:$port" --concurrency "$CONCURRENCY" \
    --stream "$s" --prompt-bytes 1024 --duration "$1" --warmup 0 --json "$2" --markdown /dev/null \
    >/dev/null 2>&1
}

# start_floor NAME PORT WRAPPER: run.sh's floor NAME (`floor` or `pingora-floor`) under WRAPPER on
# the canned pair; sets GW_PID.
start_floor() {
  local flag=
  [[ $1 == pingora-floor ]] && flag=--pingora
  port_free "$2" || die "port $2 is busy (set PORT_BASE)"
  "$3" floor-proxy $flag --listen "127.0.0.1:$2" --prefill "127.0.0.1:$((PORT_BASE + 2))" \
    --bootstrap-port $((PORT_BASE + 4)) --decode "127.0.0.1:$((PORT_BASE + 3))" --threads 2 \
    >"$OUT/logs/instructions-$1-$s.log" 2>&1 &
  GW_PID=$!
  PIDS+=("$GW_PID")
  wait_http "$http:$2/v1/chat/completions" \
    '{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}' ||
    die "$1 did not answer (see $OUT/logs/instructions-$1-$s.log)"
}

builds=("pdgate=$PDGATE_EXE" $PDGATE_ALT)
for f in $FLOORS; do
  [[ $f == floor || $f == pingora-floor ]] || die "FLOORS names floor and pingora-floor, not $f"
  [[ $TRANSPORT == http ]] || die "the floors are HTTP/1.1 gateways: FLOORS needs TRANSPORT=http"
  builds+=("$f=$BIN/pdgate-bench")
done
rows=()
port=$((PORT_BASE + 10))
for build in "${builds[@]}"; do
  name=${build%%=*}
  exe=${build#*=}
  for s in ${STREAM//,/ }; do
    data=$OUT/logs/instructions-$TRANSPORT-$name-$s
    rm -f "$data".cg*
    wrapper=$data-callgrind.sh
    printf '#!/bin/sh\nexport GLIBC_TUNABLES=%s\nexec valgrind --tool=callgrind --callgrind-out-file=%s.cg %s "$@"\n' \
      "$PDGATE_TUNABLES" "$data" "$exe" >"$wrapper"
    chmod +x "$wrapper"
    case $name in
      floor | pingora-floor) start_floor "$name" "$port" "$wrapper" ;;
      *) GW_EXE=$wrapper start_pdgate "instructions-$TRANSPORT-$name-$s" "$port" round_robin "$workers" "$extra" ;;
    esac
    load 2 "$data-warmup.json"
    callgrind_control -z "$GW_PID" >/dev/null
    load "$DURATION" "$data.json"
    callgrind_control -d "$GW_PID" >/dev/null
    requests=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$data.json" | tail -1)
    # pdgate stops on SIGINT; the plain floor only on SIGTERM (the dump is already written).
    kill -INT "$GW_PID" 2>/dev/null || true
    [[ $name != floor ]] || kill -TERM "$GW_PID" 2>/dev/null || true
    wait "$GW_PID" 2>/dev/null || true
    dump=$(ls -t "$data".cg.* 2>/dev/null | head -1 || true)
    [[ -n $dump ]] || die "no callgrind dump for $name ($s)"
    rows+=("$name" "$s" "$requests" "$dump")
    port=$((port + 2))
  done
done

md=$OUT/instructions.md
[[ $TRANSPORT == http ]] || md=$OUT/instructions-$TRANSPORT.md
commit="$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo ' (dirty tree)')"
{
  echo "# User-space instructions per request (bench/instructions.sh)"
  echo
  echo "$(date -u +%FT%TZ) — commit $commit; builds: pdgate=$PDGATE_EXE $PDGATE_ALT${FLOORS:+; floors: $FLOORS};" \
    "c=$CONCURRENCY, 1 KB chat, $TRANSPORT, canned engines, ${DURATION} s under callgrind per point."
  echo
  python3 "$ROOT/bench/instructions.py" "${rows[@]}"
} >"$md"
log "wrote $md"
cat "$md"
