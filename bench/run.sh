#!/usr/bin/env bash
# bench/run.sh — pdgate side by side with direct-to-engine and an optional peer gateway.
#
# Builds release binaries, starts mock engines on loopback, starts pdgate (and PEER_CMD) on the
# same engines, and runs `pdgate-bench sweep` over concurrency × prompt size × streaming, then a
# many-open-streams run. Every run is bounded; results land in bench/results/.
#
#   bench/run.sh                      # full run (~10 min)
#   QUICK=1 bench/run.sh              # smoke run (< 1 min once built)
#   PEER_CMD='smg launch --pd-disaggregation --prefill {prefill} {bootstrap} --decode {decode}
#     --host 127.0.0.1 --port {port} --prometheus-port {metrics_port} --policy round_robin
#     --log-level warn' PEER_NAME=smg bench/run.sh
#
# Placeholders in PEER_CMD: {prefill} {bootstrap} {decode} (engine URLs / bootstrap port), {host}
# {port} (where the peer must listen), {metrics_port} (a free port for its metrics listener).
#
# Knobs (environment): QUICK, SKIP_BUILD=1, BIN_DIR (prebuilt binaries), CARGO_TARGET_DIR,
# OUT (results dir), PORT_BASE (default 24000), DURATION / WARMUP (seconds per point),
# CONCURRENCY, PROMPTS, MODES ("canned modeled"), STREAMS (open-stream run, default 10000; 0 skips),
# HOLD_SECS, LOADGEN_THREADS, MAX_TOKENS, MODELED_TTFT_MS / MODELED_ITL_MS, HOLD_ITL_MS.
#
# Engines: three identical mock SGLang engines per mode, role `both` (they serve a PD leg body as
# a plain request, without a KV rendezvous). Direct = one of them; pdgate and the peer send the
# prefill leg to the second and the decode leg to the third. So both paths do the same engine
# work per leg and the difference is the gateway. The mocks' real rendezvous (role prefill/decode)
# opens four TCP connections per request between the mocks and is too costly for a throughput
# run on loopback (see bench/README.md); the integration tests cover it.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
QUICK=${QUICK:-0}
OUT=${OUT:-$ROOT/bench/results}
PORT_BASE=${PORT_BASE:-24000}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN_DIR:-$CARGO_TARGET_DIR/release}
PEER_CMD=${PEER_CMD:-}
PEER_NAME=${PEER_NAME:-peer}
LOADGEN_THREADS=${LOADGEN_THREADS:-2}
MAX_TOKENS=${MAX_TOKENS:-16}
MODELED_TTFT_MS=${MODELED_TTFT_MS:-20}
MODELED_ITL_MS=${MODELED_ITL_MS:-2}
HOLD_ITL_MS=${HOLD_ITL_MS:-1000}
if [[ $QUICK == 1 ]]; then
  DURATION=${DURATION:-1}; WARMUP=${WARMUP:-0.3}
  CONCURRENCY=${CONCURRENCY:-1,64}; PROMPTS=${PROMPTS:-1024}
  MODES=${MODES:-canned}; STREAMS=${STREAMS:-2000}; HOLD_SECS=${HOLD_SECS:-2}
else
  DURATION=${DURATION:-3}; WARMUP=${WARMUP:-0.3}
  CONCURRENCY=${CONCURRENCY:-1,16,64,256}; PROMPTS=${PROMPTS:-1024,32768,262144}
  MODES=${MODES:-canned modeled}; STREAMS=${STREAMS:-10000}; HOLD_SECS=${HOLD_SECS:-5}
fi

LOG_TAG=bench
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

# start_mock NAME PORT TTFT ITL: a `both` SGLang mock; sets MOCK_PID.
start_mock() {
  local name=$1 port=$2 ttft=$3 itl=$4
  port_free "$port" || die "port $port is busy (set PORT_BASE)"
  "$BIN/mock-engine" --engine sglang --role both --host 127.0.0.1 --port "$port" \
    --ttft-ms "$ttft" --itl-ms "$itl" --max-model-len 1000000 --max-running-requests 100000 \
    >"$OUT/logs/$name.log" 2>&1 &
  MOCK_PID=$!
  PIDS+=("$MOCK_PID")
  wait_http "http://127.0.0.1:$port/health" || die "mock $name did not start (see $OUT/logs/$name.log)"
}

# start_pd_pdgate NAME PORT PREFILL_PORT BOOTSTRAP DECODE_PORT: pdgate on one prefill + one decode.
start_pd_pdgate() {
  start_pdgate "$1" "$2" round_robin \
    "$(worker_yaml "http://127.0.0.1:$3" prefill "$4"; worker_yaml "http://127.0.0.1:$5" decode)"
}

# start_peer NAME PORT PREFILL_PORT BOOTSTRAP DECODE_PORT: sets PEER_PID (empty without PEER_CMD).
start_peer() {
  PEER_PID=
  [[ -n $PEER_CMD ]] || return 0
  local name=$1 port=$2 pport=$3 boot=$4 dport=$5 cmd=$PEER_CMD
  port_free "$port" || die "port $port is busy (set PORT_BASE)"
  cmd=${cmd//\{prefill\}/http://127.0.0.1:$pport}
  cmd=${cmd//\{bootstrap\}/$boot}
  cmd=${cmd//\{decode\}/http://127.0.0.1:$dport}
  cmd=${cmd//\{host\}/127.0.0.1}
  cmd=${cmd//\{port\}/$port}
  cmd=${cmd//\{metrics_port\}/$((port + 1))}
  echo "$cmd" >"$OUT/logs/$name.cmd"
  bash -c "exec $cmd" >"$OUT/logs/$name.log" 2>&1 &
  PEER_PID=$!
  PIDS+=("$PEER_PID")
  wait_http "http://127.0.0.1:$port/v1/chat/completions" \
    '{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}' \
    || die "peer did not answer (see $OUT/logs/$name.log)"
}

# ---- build -----------------------------------------------------------------------------------
build_binaries
mkdir -p "$OUT/logs"
# Many open streams need many descriptors: the gateway holds two per stream (client + decode).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
rm -f "$OUT/sweep.jsonl" "$OUT/hold.jsonl"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  if [[ -n ${BIN_DIR:-} ]]; then
    echo "binaries: prebuilt in $BIN_DIR"
  else
    echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (dirty tree)')"
  fi
  echo "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "kernel: $(uname -r); nofile: $NOFILE"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "settings: QUICK=$QUICK DURATION=$DURATION WARMUP=$WARMUP CONCURRENCY=$CONCURRENCY PROMPTS=$PROMPTS MODES='$MODES' MAX_TOKENS=$MAX_TOKENS LOADGEN_THREADS=$LOADGEN_THREADS"
  echo "peer: ${PEER_CMD:+$PEER_NAME: $PEER_CMD}"
} >"$OUT/env.txt"

# ---- sweeps ----------------------------------------------------------------------------------
: >"$OUT/sweep.md"
offset=0
for mode in $MODES; do
  case $mode in
    canned) ttft=0 itl=0 ;;
    modeled) ttft=$MODELED_TTFT_MS itl=$MODELED_ITL_MS ;;
    *) die "unknown mode $mode (canned | modeled)" ;;
  esac
  base=$((PORT_BASE + offset)); offset=$((offset + 20))
  log "mode $mode: engines TTFT ${ttft} ms, ITL ${itl} ms"
  start_mock "$mode-direct" $((base + 1)) "$ttft" "$itl"; direct_pid=$MOCK_PID
  start_mock "$mode-prefill" $((base + 2)) "$ttft" "$itl"; prefill_pid=$MOCK_PID
  start_mock "$mode-decode" $((base + 3)) "$ttft" "$itl"; decode_pid=$MOCK_PID
  start_pd_pdgate "$mode-pdgate" $((base + 10)) $((base + 2)) $((base + 4)) $((base + 3))
  targets=(--target "direct=http://127.0.0.1:$((base + 1))"
           --target "pdgate=http://127.0.0.1:$((base + 10)),pid=$GW_PID")
  start_peer "$mode-$PEER_NAME" $((base + 12)) $((base + 2)) $((base + 4)) $((base + 3))
  peer=()
  if [[ -n $PEER_PID ]]; then
    targets+=(--target "$PEER_NAME=http://127.0.0.1:$((base + 12)),pid=$PEER_PID")
    peer=(--peer "$PEER_NAME")
  fi
  "$BIN/pdgate-bench" --threads "$LOADGEN_THREADS" sweep "${targets[@]}" "${peer[@]}" \
    --watch "direct=$direct_pid" --watch "prefill=$prefill_pid" --watch "decode=$decode_pid" \
    --engine "http://127.0.0.1:$((base + 1))" --engine "http://127.0.0.1:$((base + 2))" \
    --engine "http://127.0.0.1:$((base + 3))" \
    --mode "$mode" --concurrency "$CONCURRENCY" --prompt-bytes "$PROMPTS" --stream off,on \
    --max-tokens "$MAX_TOKENS" --duration "$DURATION" --warmup "$WARMUP" \
    --json "$OUT/sweep.jsonl" --markdown "$OUT/sweep-$mode.md"
  cat "$OUT/sweep-$mode.md" >>"$OUT/sweep.md"
  stop_all
done

# ---- many open streams -----------------------------------------------------------------------
if [[ $STREAMS -gt 0 ]]; then
  # Two descriptors per stream in the gateway (client + decode leg), plus listeners and pools.
  fit=$(( (NOFILE - 400) / 2 ))
  streams=$STREAMS
  if [[ $streams -gt $fit ]]; then
    log "nofile hard limit $NOFILE fits $fit streams through a gateway, not $STREAMS: holding $fit"
    streams=$fit
  fi
  base=$((PORT_BASE + 80))
  # The prefill leg finishes at once (ITL 0); the decode leg emits a token every HOLD_ITL_MS.
  tokens=$(( (60 * 1000) / HOLD_ITL_MS + 1 ))
  start_mock hold-prefill $((base + 2)) 0 0
  start_mock hold-decode $((base + 3)) 0 "$HOLD_ITL_MS"
  start_pd_pdgate hold-pdgate $((base + 10)) $((base + 2)) $((base + 4)) $((base + 3))
  log "holding $streams open streams through pdgate"
  "$BIN/pdgate-bench" --threads "$LOADGEN_THREADS" hold --url "http://127.0.0.1:$((base + 10))" \
    --pid "$GW_PID" --label pdgate --streams "$streams" --hold "$HOLD_SECS" \
    --max-tokens "$tokens" --open-timeout 30 --json "$OUT/hold.jsonl" --markdown "$OUT/hold-pdgate.md"
  start_peer "hold-$PEER_NAME" $((base + 12)) $((base + 2)) $((base + 4)) $((base + 3))
  if [[ -n $PEER_PID ]]; then
    log "holding $streams open streams through $PEER_NAME"
    "$BIN/pdgate-bench" --threads "$LOADGEN_THREADS" hold --url "http://127.0.0.1:$((base + 12))" \
      --pid "$PEER_PID" --label "$PEER_NAME" --streams "$streams" --hold "$HOLD_SECS" \
      --max-tokens "$tokens" --open-timeout 30 --json "$OUT/hold.jsonl" --markdown "$OUT/hold-peer.md" || true
  fi
  stop_all
  cat "$OUT"/hold-*.md | awk 'NR <= 2 || !/^\| target|^\|---/' >"$OUT/hold.md"
fi

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/env.txt"

# ---- plot ------------------------------------------------------------------------------------
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$ROOT/bench/plot.py" "$OUT/sweep.jsonl" "$OUT/sweep.png" && log "plot: $OUT/sweep.png"
else
  log "matplotlib not installed (pip install matplotlib): no plot"
fi
log "results: $OUT/sweep.md $OUT/hold.md $OUT/sweep.jsonl $OUT/env.txt"
cat "$OUT/sweep.md"
[[ -f $OUT/hold.md ]] && cat "$OUT/hold.md"
exit 0
