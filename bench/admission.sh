#!/usr/bin/env bash
# bench/admission.sh — the decode admission window on HTTP workers (issue 14): how much prefill
# work a full decode wastes, with and without the window.
#
# One SGLang prefill mock and one SGLang decode mock with a running window of WINDOW (4) that it
# enforces (a request past it waits with its KV for a free slot, as SGLang's decode does), a real
# KV rendezvous between them, and CONCURRENCY (64) requests sent at once through pdgate
# (request_timeout_secs REQUEST_TIMEOUT). Run twice on the same build and config:
#
# * gated: the decode reports its window in /get_server_info; pdgate claims a slot per request
#   before dispatch and sheds what waited ADMISSION_WAIT seconds (503 + Retry-After);
# * ungated: the decode reports no window (--no-report-running-window), as any HTTP decode did
#   before this change: every request is dispatched at once.
#
# The waste is read from the engines' own records (/mock/requests): a prefill that completed (it
# computed the prompt and handed its KV over) while its room's decode did not answer (the client
# timed out, the gateway dropped it) is prefill compute spent for nothing. Each costs PREFILL_MS
# of the prefill's time. Results: bench/results/admission.md (+ admission.jsonl).
#
#   bench/admission.sh                       # release build, ~30 s once built
#   BIN_DIR=target/debug bench/admission.sh  # with debug binaries (the counts do not depend on it)
#
# Knobs: SKIP_BUILD=1, BIN_DIR, CARGO_TARGET_DIR, OUT, PORT_BASE (default 26000), WINDOW (4),
# CONCURRENCY (64), TOKENS (20), ITL_MS (50), PREFILL_MS (50), REQUEST_TIMEOUT (4),
# ADMISSION_WAIT (2).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results}
PORT_BASE=${PORT_BASE:-26000}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN_DIR:-$CARGO_TARGET_DIR/release}
WINDOW=${WINDOW:-4}
CONCURRENCY=${CONCURRENCY:-64}
TOKENS=${TOKENS:-20}
ITL_MS=${ITL_MS:-50}
PREFILL_MS=${PREFILL_MS:-50}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-4}
ADMISSION_WAIT=${ADMISSION_WAIT:-2}

LOG_TAG=admission
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

if [[ ${SKIP_BUILD:-0} != 1 && -z ${BIN_DIR:-} ]]; then
  log "building release binaries (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
  (cd "$ROOT" && cargo build --release -p pdgate -p mock-engine --bins)
fi
for b in pdgate mock-engine; do
  [[ -x $BIN/$b ]] || die "$BIN/$b missing (build, or set BIN_DIR)"
done
command -v jq >/dev/null || die "jq is needed to read the engines' records"
mkdir -p "$OUT/logs"
: >"$OUT/admission.jsonl"

start_engine() { # NAME PORT ARGS...
  local name=$1 port=$2
  shift 2
  port_free "$port" || die "port $port is busy (set PORT_BASE)"
  "$BIN/mock-engine" --engine sglang --host 127.0.0.1 --port "$port" \
    --bootstrap-timeout 120s --waiting-timeout 120s --natural-stop-every 0 "$@" \
    >"$OUT/logs/$name.log" 2>&1 &
  PIDS+=("$!")
  wait_http "http://127.0.0.1:$port/health" || die "$name did not start"
}

# run NAME DECODE_ARGS...: one measurement on fresh engines and a fresh gateway.
run() {
  local name=$1
  shift
  local p=$((PORT_BASE + 1)) boot=$((PORT_BASE + 2)) d=$((PORT_BASE + 3)) gw=$((PORT_BASE + 10))
  start_engine "admission-$name-prefill" "$p" --role prefill --bootstrap-port "$boot" \
    --ttft-ms "$PREFILL_MS"
  start_engine "admission-$name-decode" "$d" --role decode --itl-ms "$ITL_MS" \
    --max-running-requests "$WINDOW" --enforce-running-window "$@"
  local workers
  workers="$(worker_yaml "http://127.0.0.1:$p" prefill "$boot")
$(worker_yaml "http://127.0.0.1:$d" decode)"
  start_pdgate "admission-$name" "$gw" round_robin "$workers" \
    "  request_timeout_secs: $REQUEST_TIMEOUT
  pd_admission_wait_secs: $ADMISSION_WAIT
  retry_max_retries: 1"
  local window
  window=$(curl -sf "http://127.0.0.1:$gw/workers" |
    jq -r '[.workers[] | select(.worker_type == "decode") | .labels.max_running_requests // "none"][0]')
  log "$name: the decode's window as pdgate sees it: $window"

  local body results="$OUT/logs/admission-$name.clients"
  body=$(printf '{"model":"mock-model","prompt":"Tell me a story","max_tokens":%d,"ignore_eos":true}' "$TOKENS")
  : >"$results"
  local i clients=()
  for i in $(seq 1 "$CONCURRENCY"); do
    curl -s -o /dev/null -m 60 -w '%{http_code} %{time_total}\n' -H 'content-type: application/json' \
      -d "$body" "http://127.0.0.1:$gw/v1/completions" >>"$results" &
    clients+=("$!")
  done
  for i in "${clients[@]}"; do wait "$i" || true; done
  # Let the engines settle (dropped legs end, background prefill drains finish).
  sleep 1

  local pre dec
  pre=$(curl -sf "http://127.0.0.1:$p/mock/requests")
  dec=$(curl -sf "http://127.0.0.1:$d/mock/requests")
  jq -n -c --arg name "$name" --arg window "$window" --argjson pre "$pre" --argjson dec "$dec" \
    --rawfile clients "$results" --argjson prefill_ms "$PREFILL_MS" '
    def ok: .outcome.status == 200 and (.outcome.cancelled | not) and .outcome.error == null;
    def model: [.[] | select(.path == "/v1/completions")];
    ($pre | model) as $p | ($dec | model) as $d
    | ([$p[] | select(ok) | .body.bootstrap_room]) as $prefilled
    | ([$d[] | select(ok) | .body.bootstrap_room]) as $answered
    | ($clients | split("\n") | map(select(length > 0) | split(" "))) as $c
    | ($prefilled - $answered | length) as $wasted
    | {run: $name, window_seen: $window, requests: ($c | length),
       answered_200: ([$c[] | select(.[0] == "200")] | length),
       shed_503: ([$c[] | select(.[0] == "503")] | length),
       timed_out_504: ([$c[] | select(.[0] == "504")] | length),
       other: ([$c[] | select(.[0] != "200" and .[0] != "503" and .[0] != "504")] | length),
       prefills_sent: ($p | length), prefills_completed: ($prefilled | length),
       decodes_sent: ($d | length), decodes_answered: ($answered | length),
       wasted_prefills: $wasted, wasted_prefill_ms: ($wasted * $prefill_ms),
       slowest_failure_s: ((([$c[] | select(.[0] != "200") | .[1] | tonumber] | max // 0) * 100 | round) / 100)}' \
    >>"$OUT/admission.jsonl"
  tail -1 "$OUT/admission.jsonl" >&2
  stop_all
}

run gated
run ungated --no-report-running-window

{
  echo "# Decode admission on HTTP workers: prefill work wasted by a full decode"
  echo
  echo "One SGLang prefill + one SGLang decode (mocks, real KV rendezvous), the decode running at"
  echo "most $WINDOW requests at once; $CONCURRENCY completions sent at once ($TOKENS tokens, ${ITL_MS} ms apart:"
  echo "~$((TOKENS * ITL_MS / 1000)) s of decode each); request_timeout_secs $REQUEST_TIMEOUT,"
  echo "pd_admission_wait_secs $ADMISSION_WAIT; each prefill ${PREFILL_MS} ms. \`bench/admission.sh\`, $(date -u +%Y-%m-%d)."
  echo
  echo "| run | window pdgate saw | 200 | 503 shed | 504 timed out | prefills sent | prefills completed | decodes answered | wasted prefills | wasted prefill time | slowest failure |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  jq -r '"| \(.run) | \(.window_seen) | \(.answered_200) | \(.shed_503) | \(.timed_out_504) | \(.prefills_sent) | \(.prefills_completed) | \(.decodes_answered) | \(.wasted_prefills) | \(.wasted_prefill_ms) ms | \(.slowest_failure_s) s |"' \
    "$OUT/admission.jsonl"
} >"$OUT/admission.md"
cat "$OUT/admission.md"
