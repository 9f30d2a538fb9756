#!/usr/bin/env bash
# bench/cost-split.sh — where a request's CPU goes, per target: the plain floor (`floor-proxy`:
# the wire alone), the same floor inside Pingora's ProxyHttp (`floor-proxy --pingora`: what any
# gateway on Pingora pays) and pdgate, on the same canned engines at the same load (non-streamed
# 1 KB chat). Each target is recorded by `perf record` (flat, no call graph) while loaded; its
# samples are turned into µs per request by category (kernel, malloc, Pingora, tokio, pdgate, …),
# and the symbols of pdgate's excess over the Pingora floor are listed.
#
# Samples per request, like syscalls.sh's and allocs.sh's counts, move less with this VM's load
# than a CPU-time A/B: the split says which layer a change must come from.
#
#   SKIP_BUILD=1 bench/cost-split.sh                    # → bench/results/cost-split.md (~1 min once built)
#   SKIP_BUILD=1 PROMPT=262144 bench/cost-split.sh      # → bench/results/cost-split-262144.md
#
# Knobs: BIN_DIR / SKIP_BUILD / CARGO_TARGET_DIR / PGO / HALT_POLL_NS (as run.sh), CONCURRENCY
# (64), SECONDS_REC (5), FREQ (2999 Hz), PROMPT (the chat body's bytes, 1024), PORT_BASE (24900),
# OUT (bench/results; cost-split.md, -$PROMPT added for another size and -c$CONCURRENCY for another
# load; logs/ under it), FLAMEGRAPHS=1 (record call graphs too, DWARF-unwound, and draw each
# target's flamegraph with inferno — `cargo install inferno` — into logs/cost-split/NAME.svg; the
# unwinding slows the targets, so read the µs from a run without it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results}
PORT_BASE=${PORT_BASE:-24900}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN_DIR:-$CARGO_TARGET_DIR/release}
CONCURRENCY=${CONCURRENCY:-64}
SECONDS_REC=${SECONDS_REC:-5}
FREQ=${FREQ:-2999}
PROMPT=${PROMPT:-1024}
REPORT=$OUT/cost-split$([ "$PROMPT" = 1024 ] || echo "-$PROMPT")$([ "$CONCURRENCY" = 64 ] || echo "-c$CONCURRENCY").md

LOG_TAG=cost-split
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

command -v perf >/dev/null || die "perf not installed (linux-tools)"
graph=()
if [[ ${FLAMEGRAPHS:-0} == 1 ]]; then
  command -v inferno-flamegraph >/dev/null || die "FLAMEGRAPHS=1 needs inferno (cargo install inferno)"
  graph=(--call-graph dwarf,16384)
fi
build_binaries
pgo_build
halt_poll_set
mkdir -p "$OUT/logs"
DATA=$OUT/logs/cost-split
mkdir -p "$DATA"
http=http://127.0.0.1
start_canned_pair cost-split
floor_args=(--prefill "127.0.0.1:$((PORT_BASE + 2))" --bootstrap-port $((PORT_BASE + 4))
  --decode "127.0.0.1:$((PORT_BASE + 3))" --threads 2)
"$BIN/pdgate-bench" floor-proxy --listen "127.0.0.1:$((PORT_BASE + 10))" "${floor_args[@]}" \
  >"$OUT/logs/cost-split-floor.log" 2>&1 &
FLOOR=$!
PIDS+=("$FLOOR")
"$BIN/pdgate-bench" floor-proxy --pingora --listen "127.0.0.1:$((PORT_BASE + 11))" "${floor_args[@]}" \
  >"$OUT/logs/cost-split-pingora-floor.log" 2>&1 &
PFLOOR=$!
PIDS+=("$PFLOOR")
start_pdgate cost-split-pdgate $((PORT_BASE + 12)) round_robin "$workers"
chat='{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
for p in 10 11; do
  wait_http "$http:$((PORT_BASE + p))/v1/chat/completions" "$chat" || die "a floor did not answer"
done

# record NAME PORT PID: load the target, perf it for SECONDS_REC in the middle of the load.
record() {
  local name=$1 port=$2 pid=$3
  rm -f "$DATA/$name.json"
  (
    sleep 1
    perf record -F "$FREQ" "${graph[@]}" -p "$pid" -o "$DATA/$name.data" -- sleep "$SECONDS_REC" \
      >/dev/null 2>&1
  ) &
  local rec=$!
  "$BIN/pdgate-bench" --threads 1 sweep --target "$name=$http:$port" --concurrency "$CONCURRENCY" \
    --prompt-bytes "$PROMPT" --stream off --duration $((SECONDS_REC + 2)) --warmup 0.5 \
    --json "$DATA/$name.json" --markdown /dev/null >/dev/null 2>&1
  wait "$rec"
  python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["rps"])' \
    "$DATA/$name.json" >"$DATA/$name.rps"
  perf report -i "$DATA/$name.data" --no-children --sort dso,sym --stdio \
    -F overhead,sample,dso,sym 2>/dev/null | grep '%' >"$DATA/$name.txt"
  if [[ ${FLAMEGRAPHS:-0} == 1 ]]; then
    perf script -i "$DATA/$name.data" 2>/dev/null | inferno-collapse-perf \
      | inferno-flamegraph --title "$name, c=$CONCURRENCY, $PROMPT-byte chat" >"$DATA/$name.svg"
  fi
  log "$name: $(cat "$DATA/$name.rps") req/s while recorded"
}
record floor $((PORT_BASE + 10)) "$FLOOR"
record pingora-floor $((PORT_BASE + 11)) "$PFLOOR"
record pdgate $((PORT_BASE + 12)) "$GW_PID"
# Read before the report is opened (truncated, it would make the tree look dirty).
commit="$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo ' (dirty tree)')"
{
  echo "# Where a request's CPU goes: floor, Pingora floor, pdgate (bench/cost-split.sh)"
  echo
  echo "$(date -u +%FT%TZ) — commit $commit;" \
    "c=$CONCURRENCY, non-streamed chat of $PROMPT bytes, canned engines; perf -F $FREQ for ${SECONDS_REC} s each; load average $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "pdgate: $PDGATE_EXE; $(idle_line)."
  echo
  python3 "$ROOT/bench/cost_split.py" "$FREQ" "$SECONDS_REC" "$DATA" floor pingora-floor pdgate
} >"$REPORT"
log "wrote $REPORT"
cat "$REPORT"
