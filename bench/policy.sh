#!/usr/bin/env bash
# bench/policy.sh — routing policies, measured two ways (issue 6):
#
# 1. micro: `pdgate::policy::bench_report` in release (select / full request cost per policy at
#    8, 128, 1024 workers and 1 KB, 32 KB, 256 KB prompts) → bench/results/policy-micro.md;
# 2. end to end: 4 SGLang prefill mocks with prefix caching + 1 decode mock (a real KV
#    rendezvous), a multi-turn workload where 8 system prompts are shared by 64 conversations, run
#    through pdgate once with `prefill_policy: cache_aware` and once with `round_robin`; the prefix
#    hit rate is cached_tokens / prompt_tokens as the engines report them → policy-e2e.md.
#    A single engine serving the same workload gives the upper bound (one cache sees everything).
#
#   bench/policy.sh            # ~1.5 min once built
#   QUICK=1 bench/policy.sh    # shorter timing cells, smaller workload
#
# Knobs: SKIP_BUILD=1, BIN_DIR, CARGO_TARGET_DIR, OUT, PORT_BASE (default 25000), MIN_MS,
# CONVERSATIONS, TURNS, SYSTEMS, POLICIES ("cache_aware round_robin").
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
QUICK=${QUICK:-0}
OUT=${OUT:-$ROOT/bench/results}
PORT_BASE=${PORT_BASE:-25000}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN_DIR:-$CARGO_TARGET_DIR/release}
POLICIES=${POLICIES:-cache_aware round_robin}
SYSTEMS=${SYSTEMS:-8}
if [[ $QUICK == 1 ]]; then
  MIN_MS=${MIN_MS:-20}; CONVERSATIONS=${CONVERSATIONS:-32}; TURNS=${TURNS:-3}
else
  MIN_MS=${MIN_MS:-200}; CONVERSATIONS=${CONVERSATIONS:-64}; TURNS=${TURNS:-4}
fi

LOG_TAG=policy
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

build_binaries
mkdir -p "$OUT/logs"

# ---- 1. micro-benchmark ----------------------------------------------------------------------
log "policy micro-benchmark (min ${MIN_MS} ms per cell)"
"$BIN/pdgate-bench" policy --min-ms "$MIN_MS" --markdown "$OUT/policy-micro.md" ||
  die "pdgate-bench was built without --features policy"

# ---- 2. end to end: prefix hit rate ----------------------------------------------------------
start_engine() { # NAME ROLE PORT [BOOTSTRAP]
  local name=$1 role=$2 port=$3 boot=${4:-}
  port_free "$port" || die "port $port is busy (set PORT_BASE)"
  local extra=()
  [[ -n $boot ]] && extra=(--bootstrap-port "$boot")
  "$BIN/mock-engine" --engine sglang --role "$role" --host 127.0.0.1 --port "$port" "${extra[@]}" \
    --ttft-ms 0 --itl-ms 0 --max-model-len 1000000 >"$OUT/logs/$name.log" 2>&1 &
  PIDS+=("$!")
  wait_http "http://127.0.0.1:$port/health" || die "$name did not start"
}

prefills=()
workers=""
for i in 1 2 3 4; do
  port=$((PORT_BASE + i)); boot=$((PORT_BASE + 10 + i))
  start_engine "prefix-prefill-$i" prefill "$port" "$boot"
  prefills+=(--engine "http://127.0.0.1:$port")
  workers+=$(worker_yaml "http://127.0.0.1:$port" prefill "$boot")$'\n'
done
decode_port=$((PORT_BASE + 5))
start_engine prefix-decode decode "$decode_port"
workers+=$(worker_yaml "http://127.0.0.1:$decode_port" decode)
single_port=$((PORT_BASE + 6))
start_engine prefix-single both "$single_port"

workload=(--systems "$SYSTEMS" --conversations "$CONVERSATIONS" --turns "$TURNS")
rm -f "$OUT/policy-e2e.jsonl"
log "upper bound: the workload on one engine"
"$BIN/pdgate-bench" prefix --url "http://127.0.0.1:$single_port" --label "one engine (upper bound)" \
  "${workload[@]}" --json "$OUT/policy-e2e.jsonl" --markdown /dev/null

gw_port=$((PORT_BASE + 20))
# Stops the gateway of the last run (the engines stay up for the next policy).
stop_gateway() {
  kill "$GW_PID" 2>/dev/null || true
  wait "$GW_PID" 2>/dev/null || true
  local keep=() p
  for p in "${PIDS[@]}"; do [[ $p != "$GW_PID" ]] && keep+=("$p"); done
  PIDS=("${keep[@]}")
}
for policy in $POLICIES; do
  for p in "${prefills[@]}"; do
    [[ $p == --engine ]] && continue
    curl -sf -m 5 -o /dev/null -X POST "$p/flush_cache" || die "flush_cache on $p failed"
  done
  start_pdgate "prefix-$policy" "$gw_port" "$policy" "$workers"
  log "pdgate, prefill_policy=$policy"
  "$BIN/pdgate-bench" prefix --url "http://127.0.0.1:$gw_port" --label "pdgate, prefill_policy: $policy" \
    "${workload[@]}" "${prefills[@]}" --json "$OUT/policy-e2e.jsonl" --markdown /dev/null
  stop_gateway
done
stop_all

# One table for all runs.
"$BIN/pdgate-bench" table prefix "$OUT/policy-e2e.jsonl" >"$OUT/policy-e2e.md"
{
  echo "workload: $SYSTEMS system prompts (4 KB), $CONVERSATIONS conversations × $TURNS turns (1 KB user + 256 B assistant per turn), 8 connections; 4 prefill + 1 decode SGLang mocks (block 16 tokens)"
} >>"$OUT/policy-e2e.md"
cat "$OUT/policy-micro.md" "$OUT/policy-e2e.md"
