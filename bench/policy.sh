#!/usr/bin/env bash
# bench/policy.sh — routing policies, measured three ways (issues 6 and 12):
#
# 1. micro: `pdgate::policy::bench_report` in release (select / full request cost per policy at
#    8, 128, 1024 workers and 1 KB, 32 KB, 256 KB prompts) → bench/results/policy-micro.md;
# 2. end to end: 4 SGLang prefill mocks with prefix caching + 1 decode mock (a real KV
#    rendezvous), a multi-turn workload where 8 system prompts are shared by 64 conversations, run
#    through pdgate once with `prefill_policy: cache_aware` and once with `round_robin`; the prefix
#    hit rate is cached_tokens / prompt_tokens as the engines report them → policy-e2e.md.
#    A single engine serving the same workload gives the upper bound (one cache sees everything).
# 3. a slow decode's share: 1 prefill + 3 SGLang decode mocks, one of them answering in ~900 ms
#    (4 tokens, SLOW_ITL_MS=300 apart) and the others at once, every decode reporting an empty
#    queue on /v1/loads; load monitoring on (1 s polls, and a handshake through
#    smg_workers_overloaded so the run starts with those reports in use); 150 chat requests from 12
#    clients through pdgate once per `decode_policy` → policy-share.md. An even split gives the
#    slow decode a third; a policy that weighs the gateway's requests in flight gives it a few %.
#
#   bench/policy.sh                 # ~2 min once built
#   QUICK=1 bench/policy.sh         # shorter timing cells, smaller workload
#   PARTS=share bench/policy.sh     # only the slow decode's share (~30 s)
#
# Knobs: SKIP_BUILD=1, BIN_DIR, CARGO_TARGET_DIR, OUT, PORT_BASE (default 25000), PARTS
# ("micro prefix share"), MIN_MS, CONVERSATIONS, TURNS, SYSTEMS, POLICIES ("cache_aware
# round_robin"), SHARE_POLICIES ("least_load power_of_two round_robin random"), SHARE_REQUESTS
# (150), SHARE_CONCURRENCY (12), SLOW_ITL_MS (300).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
QUICK=${QUICK:-0}
OUT=${OUT:-$ROOT/bench/results}
PORT_BASE=${PORT_BASE:-25000}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN_DIR:-$CARGO_TARGET_DIR/release}
PARTS=${PARTS:-micro prefix share}
POLICIES=${POLICIES:-cache_aware round_robin}
SYSTEMS=${SYSTEMS:-8}
SHARE_POLICIES=${SHARE_POLICIES:-least_load power_of_two round_robin random}
SHARE_REQUESTS=${SHARE_REQUESTS:-150}
SHARE_CONCURRENCY=${SHARE_CONCURRENCY:-12}
SLOW_ITL_MS=${SLOW_ITL_MS:-300}
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

part() { [[ " $PARTS " == *" $1 "* ]]; }

start_engine() { # NAME ROLE PORT [BOOTSTRAP] [ITL_MS]
  local name=$1 role=$2 port=$3 boot=${4:-} itl=${5:-0}
  port_free "$port" || die "port $port is busy (set PORT_BASE)"
  local extra=()
  [[ -n $boot ]] && extra=(--bootstrap-port "$boot")
  "$BIN/mock-engine" --engine sglang --role "$role" --host 127.0.0.1 --port "$port" "${extra[@]}" \
    --ttft-ms 0 --itl-ms "$itl" --max-model-len 1000000 >"$OUT/logs/$name.log" 2>&1 &
  PIDS+=("$!")
  wait_http "http://127.0.0.1:$port/health" || die "$name did not start"
}

# Stops the gateway of the last run (the engines stay up for the next policy).
stop_gateway() {
  kill "$GW_PID" 2>/dev/null || true
  wait "$GW_PID" 2>/dev/null || true
  local keep=() p
  for p in "${PIDS[@]}"; do [[ $p != "$GW_PID" ]] && keep+=("$p"); done
  PIDS=("${keep[@]}")
}

# ---- 1. micro-benchmark ----------------------------------------------------------------------
if part micro; then
  log "policy micro-benchmark (min ${MIN_MS} ms per cell)"
  "$BIN/pdgate-bench" policy --min-ms "$MIN_MS" --markdown "$OUT/policy-micro.md" ||
    die "pdgate-bench was built without --features policy"
  cat "$OUT/policy-micro.md"
fi

# ---- 2. end to end: prefix hit rate ----------------------------------------------------------
if part prefix; then
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
  cat "$OUT/policy-e2e.md"
fi

# ---- 3. a slow decode's share ----------------------------------------------------------------
# set_reports WAITING URL...: the mocks report WAITING waiting requests, nothing running and no KV
# in use on /v1/loads until told otherwise (POST /mock/load).
set_reports() {
  local waiting=$1 u
  shift
  for u in "$@"; do
    curl -sf -m 5 -o /dev/null -H 'content-type: application/json' \
      -d "{\"waiting\": $waiting, \"running\": 0, \"token_usage\": 0.0}" "$u/mock/load" ||
      die "POST $u/mock/load failed"
  done
}
# wait_overloaded METRICS_PORT N: until pdgate flags N workers overloaded (30 s at most).
wait_overloaded() {
  local i
  for i in $(seq 1 300); do
    curl -sf -m 2 "http://127.0.0.1:$1/metrics" |
      grep -qxF "smg_workers_overloaded{model=\"all\"} $2" && return 0
    sleep 0.1
  done
  return 1
}

if part share; then
  base=$((PORT_BASE + 30))
  start_engine share-prefill prefill $((base + 1)) $((base + 11))
  workers=$(worker_yaml "http://127.0.0.1:$((base + 1))" prefill $((base + 11)))$'\n'
  decodes=()
  for i in 0 1 2; do
    port=$((base + 2 + i))
    itl=0
    [[ $i == 0 ]] && itl=$SLOW_ITL_MS
    start_engine "share-decode-$i" decode "$port" "" "$itl"
    decodes+=("http://127.0.0.1:$port")
    workers+=$(worker_yaml "http://127.0.0.1:$port" decode)$'\n'
  done
  engines=()
  for d in "${decodes[@]}"; do engines+=(--engine "$d"); done

  rm -f "$OUT/policy-share.jsonl"
  gw_port=$((base + 20))
  for policy in $SHARE_POLICIES; do
    # Handshake with the load monitor: every decode reports a queue over the overload threshold
    # until pdgate flags all three, then an empty one until it flags none. Nothing is sent meanwhile.
    set_reports 1000 "${decodes[@]}"
    start_pdgate "share-$policy" "$gw_port" round_robin "$workers" \
      "  decode_policy: $policy
  load_monitor_interval: 1
  worker_overload_waiting_requests: 1000"
    wait_overloaded $((gw_port + 1)) 3 || die "pdgate never used the decodes' load reports"
    set_reports 0 "${decodes[@]}"
    wait_overloaded $((gw_port + 1)) 0 || die "pdgate never used the empty load reports"
    log "pdgate, decode_policy=$policy: $SHARE_REQUESTS requests from $SHARE_CONCURRENCY clients"
    "$BIN/pdgate-bench" share --url "http://127.0.0.1:$gw_port" --label "decode_policy: $policy" \
      --requests "$SHARE_REQUESTS" --concurrency "$SHARE_CONCURRENCY" --max-tokens 4 "${engines[@]}" \
      --json "$OUT/policy-share.jsonl" --markdown /dev/null
    stop_gateway
  done
  stop_all

  "$BIN/pdgate-bench" table share "$OUT/policy-share.jsonl" >"$OUT/policy-share.md"
  {
    echo "workload: $SHARE_REQUESTS chat requests (1 KB prompt, 4 tokens out) from $SHARE_CONCURRENCY clients, each sending its next when its answer arrived; 1 prefill + 3 SGLang decode mocks, the slow one (first column) $SLOW_ITL_MS ms between tokens (≈ $((3 * SLOW_ITL_MS)) ms an answer), the others 0; every decode reports an empty queue; load_monitor_interval 1 s"
  } >>"$OUT/policy-share.md"
  cat "$OUT/policy-share.md"
fi
