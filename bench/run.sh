#!/usr/bin/env bash
# bench/run.sh — pdgate side by side with direct-to-engine and a peer gateway (SMG by default).
#
# Builds release binaries, starts mock engines on loopback, starts pdgate (and PEER_CMD) on the
# same engines, and runs `pdgate-bench sweep` over concurrency × prompt size × streaming, then a
# many-open-streams run. Every run is bounded; results land in bench/results/.
#
#   bench/run.sh                      # full run (~10 min)
#   QUICK=1 bench/run.sh              # smoke run (< 1 min once built)
#   # the ratio table (results/ratio.md): near-zero-cost engines, SMG 1.13.0 already installed
#   ROUNDS=3 ENGINES=canned-fast MODES=canned CONCURRENCY=1,64 PROMPTS=1024 STREAMS=10000
#     SMG_VENV=/tmp/smg-venv bench/run.sh
#   PEER_CMD='other-gateway --prefill {prefill} …' PEER_NAME=other bench/run.sh   # another peer
#
#   # the gRPC path: pdgate over HTTP and over gRPC, SMG over gRPC (see bench/README.md)
#   MODES=grpc-canned STREAMS=0 CONCURRENCY=1,64 PROMPTS=1024 PEER_NAME=smg PEER_GRPC_CMD='smg
#     launch --pd-disaggregation --prefill {prefill} {bootstrap} --decode {decode}
#     --model-path {model_path} --host {host} --port {port} --prometheus-port {metrics_port}
#     --policy round_robin --log-level warn' bench/run.sh
#   # several pdgate builds in one run (an A/B), three rounds with the order reversed every other
#   BIN_DIR=/tmp/pdgate-head PDGATE_ALT='before=/tmp/pdgate-before/pdgate' ROUNDS=3
#     MODES=canned STREAM=off STREAMS=0 CONCURRENCY=1,64 PROMPTS=1024 bench/run.sh
#   # one build, two configs: tracing off (pdgate) and on (traced, exporting to a mock collector)
#   PDGATE_ALT="traced=$PWD/target/release/pdgate" PDGATE_ALT_YAML='  enable_trace: true
#     otlp_traces_endpoint: {otlp_grpc}' ROUNDS=3 MODES=canned STREAMS=0 CONCURRENCY=1,64 bench/run.sh
#
# Placeholders in PEER_CMD / PEER_GRPC_CMD: {prefill} {bootstrap} {decode} (engine URLs — http://
# or grpc:// — and the bootstrap port), {host} {port} (where the peer must listen), {metrics_port}
# (a free port for its metrics listener), {model_path} (the model directory of the gRPC modes).
#
# Peer: PEER_CMD when set; else SMG 1.13.0 (`smg` from SMG_VENV, default bench/.venv-smg, created
# with `pip install smg==1.13.0` when missing; skipped with a note when that fails), named `smg`;
# NO_PEER=1 runs without a peer.
#
# Engines (ENGINES, for the `canned` mode): `canned-fast` (default) = `pdgate-bench canned-engine`,
# answers preformatted in a few µs of CPU, so the gateways' cost is not drowned by the engines';
# the sweep is labelled `canned-fast`. `mock` = `mock-engine --role both --ttft-ms 0 --itl-ms 0`
# (~85 µs per call), as before. `modeled`, the gRPC modes and the open-stream run always use
# mock-engine (they need its timing and its gRPC side).
#
# Floor (FLOOR, default 1; 0 skips it): in the canned-fast sweep, `pdgate-bench floor-proxy` runs as
# one more target on the gateways' engines — the least a PD gateway can do per request (splice the
# bootstrap fields, both legs at once, the decode's answer back in one write; bench/src/floor.rs) —
# and results/ratio.md gets its column: what the wire alone costs on this machine in this run;
# `floor-proxy --pingora` (target `pingora-floor`) is the same inside Pingora's ProxyHttp: what a
# gateway on Pingora cannot go below (bench/src/floor_pingora.rs).
#
# Modes: canned, modeled (HTTP engines); grpc-canned, grpc-modeled: the same HTTP engines and
# pdgate on them (target `pdgate-http`, and PEER_CMD's peer), plus two gRPC SGLang mocks with
# pdgate on them (`pdgate-grpc`, the subject of the tables) and PEER_GRPC_CMD's peer
# (`$PEER_NAME-grpc`, the tables' peer). The gateway tokenizes with a small model directory that
# `pdgate-bench write-model` writes to MODEL_DIR, and the mocks emit that model's word pieces.
#
# Knobs (environment): QUICK, SKIP_BUILD=1, PGO=1 (measure bench/pgo.sh's profile-guided build as
# `pdgate`, made first unless SKIP_BUILD=1 finds it; PDGATE_ALT="plain=target/release/pdgate" runs
# the plain one beside it), FLOOR_EXE (the floors' pdgate-bench binary, default $BIN's), ENGINES,
# NO_PEER, SMG_VENV, STREAM_CHUNKS (canned-fast engines' tokens per answer, default MAX_TOKENS),
# BIN_DIR (prebuilt binaries), CARGO_TARGET_DIR, OUT (results dir), PORT_BASE (default 24000),
# DURATION / WARMUP (seconds per point), CONCURRENCY, PROMPTS, STREAM ("off,on"), MODES ("canned
# modeled"), ROUNDS (default 1: each mode's sweep runs this many times, labelled MODE/rN, gateways
# in reverse order every other round; sweep-MODE-pivot.md gives the medians), STREAMS (open-stream
# run, default 10000; 0 skips), HOLD_SECS, LOADGEN_THREADS, MAX_TOKENS, MODELED_TTFT_MS /
# MODELED_ITL_MS, HOLD_ITL_MS, PDGATE_ALT ("NAME=PATH …": other pdgate binaries, each run with the
# same generated config on the same HTTP engines as target NAME, right after pdgate; the first is
# the HTTP tables' peer when there is no PEER_CMD), PDGATE_ALT_YAML (more `gateway:` lines, indented
# two spaces, for PDGATE_ALT's gateways only; `{otlp_grpc}` / `{otlp_http}` in it start a mock OTLP
# collector, `mock-collector`, and name its gRPC / HTTP endpoint), PEER_GRPC_CMD / PEER_GRPC_NAME,
# MODEL_DIR (default $OUT/model), GRPC_YAML (more `gateway:` lines, indented two spaces, for the
# gRPC pdgate only, e.g. '  tokenizer_cache_enable_l0: true'), UNIQUE_PROMPTS=1 (every request's
# prompt differs: its first word carries the connection and request number, so no tokenizer or
# prefix cache can serve a repeat), HALT_POLL_NS (root, `haltpoll` guests: guest_halt_poll_ns for
# the run, put back on exit — 200000 is the kernel's default, this VM ships 0; env.txt says which).
#
# Engines: three identical SGLang engines per mode (canned-fast or mock `both`: they serve a PD
# leg body as a plain request, without a KV rendezvous). Direct = one of them; pdgate and the peer send the
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
PEER_NAME=${PEER_NAME:-}
NO_PEER=${NO_PEER:-0}
SMG_VENV=${SMG_VENV:-$ROOT/bench/.venv-smg}
SMG_VERSION=1.13.0
ENGINES=${ENGINES:-canned-fast}
FLOOR=${FLOOR:-1}
PEER_GRPC_CMD=${PEER_GRPC_CMD:-}
PDGATE_ALT=${PDGATE_ALT:-}
PDGATE_ALT_YAML=${PDGATE_ALT_YAML:-}
STREAM=${STREAM:-off,on}
ROUNDS=${ROUNDS:-1}
MODEL_DIR=${MODEL_DIR:-$OUT/model}
LOADGEN_THREADS=${LOADGEN_THREADS:-2}
MAX_TOKENS=${MAX_TOKENS:-16}
MODELED_TTFT_MS=${MODELED_TTFT_MS:-20}
MODELED_ITL_MS=${MODELED_ITL_MS:-2}
HOLD_ITL_MS=${HOLD_ITL_MS:-1000}
STREAM_CHUNKS=${STREAM_CHUNKS:-$MAX_TOKENS}
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
  run_mock "$name" "http://127.0.0.1:$port/health" --engine sglang --role both --host 127.0.0.1 \
    --port "$port" --ttft-ms "$ttft" --itl-ms "$itl" --max-model-len 1000000 \
    --max-running-requests 100000
}

# smg_peer: when no PEER_CMD is given, SMG $SMG_VERSION from SMG_VENV (installed there with pip
# when missing) becomes the peer; sets PEER_CMD and PEER_NAME, or says why there is no peer.
smg_peer() {
  [[ -z $PEER_CMD && $NO_PEER != 1 ]] || return 0
  local smg=$SMG_VENV/bin/smg
  if [[ ! -x $smg ]]; then
    log "installing SMG $SMG_VERSION into $SMG_VENV (set SMG_VENV to reuse an install, NO_PEER=1 to skip)"
    if ! { python3 -m venv "$SMG_VENV" && "$SMG_VENV/bin/pip" install -q "smg==$SMG_VERSION"; } \
      >"$OUT/logs/smg-install.log" 2>&1; then
      log "note: SMG could not be installed (see $OUT/logs/smg-install.log): running without a peer"
      return 0
    fi
  fi
  # SMG waits 180 s for in-flight requests by default when stopped; the bench has none left.
  PEER_CMD="$smg launch --pd-disaggregation --prefill {prefill} {bootstrap} --decode {decode}"
  PEER_CMD+=" --host {host} --port {port} --prometheus-port {metrics_port} --policy round_robin"
  PEER_CMD+=" --log-level warn --shutdown-grace-period-secs 1"
  PEER_NAME=${PEER_NAME:-smg}
}

# start_floor NAME PORT PREFILL_PORT BOOTSTRAP DECODE_PORT: `pdgate-bench floor-proxy`, the least a
# PD gateway can do per request (bench/src/floor.rs), on the gateways' engines; sets FLOOR_PID.
# With a sixth argument (`--pingora`), the same floor inside Pingora's ProxyHttp
# (bench/src/floor_pingora.rs). FLOOR_EXE (default $BIN/pdgate-bench) is the binary that runs them.
start_floor() {
  local name=$1 port=$2
  port_free "$port" || die "port $port is busy (set PORT_BASE)"
  "${FLOOR_EXE:-$BIN/pdgate-bench}" floor-proxy --listen "127.0.0.1:$port" --prefill "127.0.0.1:$3" \
    --bootstrap-port "$4" --decode "127.0.0.1:$5" --threads 2 ${6:-} >"$OUT/logs/$name.log" 2>&1 &
  FLOOR_PID=$!
  PIDS+=("$FLOOR_PID")
  wait_http "http://127.0.0.1:$port/v1/chat/completions" \
    '{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}' \
    || die "floor-proxy did not answer (see $OUT/logs/$name.log)"
}

# alt_yaml BASE: sets ALT_EXTRA to PDGATE_ALT_YAML with its collector placeholders resolved (and
# the mock collector started on BASE+30 / BASE+31 when it names one).
alt_yaml() {
  local base=$1 yaml=$PDGATE_ALT_YAML
  if [[ $yaml == *"{otlp_"* ]]; then
    local grpc=$((base + 30)) http=$((base + 31))
    port_free "$grpc" && port_free "$http" || die "ports $grpc/$http are busy (set PORT_BASE)"
    "$BIN/mock-collector" --host 127.0.0.1 --grpc-port "$grpc" --http-port "$http" --keep 0 \
      >"$OUT/logs/collector-$base.log" 2>&1 &
    PIDS+=("$!")
    wait_http "http://127.0.0.1:$http/mock/stats" || die "mock collector did not start"
    yaml=${yaml//\{otlp_grpc\}/127.0.0.1:$grpc}
    yaml=${yaml//\{otlp_http\}/http://127.0.0.1:$http/v1/traces}
  fi
  ALT_EXTRA=$yaml
}

# start_peer NAME PORT PREFILL_URL BOOTSTRAP DECODE_URL CMD: sets PEER_PID (empty without CMD).
start_peer() {
  PEER_PID=
  [[ -n ${6:-} ]] || return 0
  local name=$1 port=$2 prefill=$3 boot=$4 decode=$5 cmd=$6
  port_free "$port" || die "port $port is busy (set PORT_BASE)"
  cmd=${cmd//\{prefill\}/$prefill}
  cmd=${cmd//\{bootstrap\}/$boot}
  cmd=${cmd//\{decode\}/$decode}
  cmd=${cmd//\{host\}/127.0.0.1}
  cmd=${cmd//\{port\}/$port}
  cmd=${cmd//\{metrics_port\}/$((port + 1))}
  cmd=${cmd//\{model_path\}/$MODEL_DIR}
  echo "$cmd" >"$OUT/logs/$name.cmd"
  bash -c "exec $cmd" >"$OUT/logs/$name.log" 2>&1 &
  PEER_PID=$!
  PIDS+=("$PEER_PID")
  wait_http "http://127.0.0.1:$port/v1/chat/completions" \
    '{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}' \
    || die "peer $name did not answer (see $OUT/logs/$name.log)"
}

# ---- build -----------------------------------------------------------------------------------
build_binaries
pgo_build
halt_poll_set
mkdir -p "$OUT/logs"
smg_peer
PEER_NAME=${PEER_NAME:-peer}
PEER_GRPC_NAME=${PEER_GRPC_NAME:-$PEER_NAME-grpc}
# Many open streams need many descriptors: the gateway holds two per stream (client + decode).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
rm -f "$OUT/sweep.jsonl" "$OUT/hold.jsonl" "$OUT"/sweep-*.jsonl "$OUT/ratio.md"
case " $MODES " in
  *" grpc-"*)
    write_model
    ;;
esac

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  if [[ -n ${BIN_DIR:-} ]]; then
    echo "binaries: prebuilt in $BIN_DIR"
  else
    echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (dirty tree)')"
  fi
  echo "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "kernel: $(uname -r); nofile: $NOFILE"
  idle_line
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "settings: QUICK=$QUICK DURATION=$DURATION WARMUP=$WARMUP CONCURRENCY=$CONCURRENCY PROMPTS=$PROMPTS MODES='$MODES' MAX_TOKENS=$MAX_TOKENS LOADGEN_THREADS=$LOADGEN_THREADS"
  echo "peer: ${PEER_CMD:+$PEER_NAME: $PEER_CMD}"
  echo "gRPC peer: ${PEER_GRPC_CMD:+$PEER_GRPC_NAME: $PEER_GRPC_CMD}"
  echo "pdgate: $PDGATE_EXE$([[ ${PGO:-0} == 1 ]] && echo ' (profile-guided, bench/pgo.sh)')"
  [[ -z $PDGATE_ALT ]] || echo "other pdgate builds: $PDGATE_ALT"
  [[ -z $PDGATE_ALT_YAML ]] || echo "their extra gateway keys: $(echo "$PDGATE_ALT_YAML" | xargs)"
  echo "STREAM=$STREAM ROUNDS=$ROUNDS MODEL_DIR=$MODEL_DIR ENGINES=$ENGINES STREAM_CHUNKS=$STREAM_CHUNKS"
} >"$OUT/env.txt"

# start_canned_engine NAME PORT TTFT ITL: the canned engine with start_mock's arguments, which
# the sweeps pass to either. It has no timing (TTFT and ITL are the modeled modes'); its answers
# have STREAM_CHUNKS tokens (start_canned's third argument is a token count, not a TTFT).
start_canned_engine() { start_canned "$1" "$2" "$STREAM_CHUNKS"; }

# ---- sweeps ----------------------------------------------------------------------------------
: >"$OUT/sweep.md"
offset=0
for mode in $MODES; do
  case $mode in
    canned | grpc-canned) ttft=0 itl=0 ;;
    modeled | grpc-modeled) ttft=$MODELED_TTFT_MS itl=$MODELED_ITL_MS ;;
    *) die "unknown mode $mode (canned | modeled | grpc-canned | grpc-modeled)" ;;
  esac
  grpc=0
  [[ $mode == grpc-* ]] && grpc=1
  engine=start_mock
  case $mode:$ENGINES in
    canned:canned-fast) engine=start_canned_engine; mode=canned-fast ;;
    *:canned-fast | *:mock) ;;
    *) die "unknown ENGINES=$ENGINES (canned-fast | mock)" ;;
  esac
  base=$((PORT_BASE + offset)); offset=$((offset + 40))
  log "mode $mode: engines ${engine#start_}, TTFT ${ttft} ms, ITL ${itl} ms"
  http=http://127.0.0.1
  $engine "$mode-direct" $((base + 1)) "$ttft" "$itl"; direct_pid=$MOCK_PID
  $engine "$mode-prefill" $((base + 2)) "$ttft" "$itl"; prefill_pid=$MOCK_PID
  $engine "$mode-decode" $((base + 3)) "$ttft" "$itl"; decode_pid=$MOCK_PID
  watch=(--watch "direct=$direct_pid" --watch "prefill=$prefill_pid" --watch "decode=$decode_pid")
  engines=(--engine "$http:$((base + 1))" --engine "$http:$((base + 2))" --engine "$http:$((base + 3))")
  # The gateways, in the order they run at each point (direct always first).
  gateways=()
  subject=pdgate
  [[ $grpc == 1 ]] && subject=pdgate-http
  start_pd_pdgate "$mode-$subject" $((base + 10)) "$http:$((base + 2))" $((base + 4)) "$http:$((base + 3))"
  gateways+=("$subject=$http:$((base + 10)),pid=$GW_PID")
  alt_port=$((base + 20)) first_alt= ALT_EXTRA=
  [[ -z $PDGATE_ALT || -z $PDGATE_ALT_YAML ]] || alt_yaml "$base"
  for alt in $PDGATE_ALT; do
    [[ $alt == *=* ]] || die "PDGATE_ALT: want NAME=PATH, got $alt"
    GW_EXE=${alt#*=} start_pd_pdgate "$mode-${alt%%=*}" $alt_port \
      "$http:$((base + 2))" $((base + 4)) "$http:$((base + 3))" "$ALT_EXTRA"
    gateways+=("${alt%%=*}=$http:$alt_port,pid=$GW_PID")
    first_alt=${first_alt:-${alt%%=*}}
    alt_port=$((alt_port + 2))
  done
  start_peer "$mode-$PEER_NAME" $((base + 12)) "$http:$((base + 2))" $((base + 4)) \
    "$http:$((base + 3))" "$PEER_CMD"
  [[ -z $PEER_PID ]] || gateways+=("$PEER_NAME=$http:$((base + 12)),pid=$PEER_PID")
  if [[ $mode == canned-fast && $FLOOR == 1 ]]; then
    start_floor "$mode-floor" $((base + 18)) $((base + 2)) $((base + 4)) $((base + 3))
    gateways+=("floor=$http:$((base + 18)),pid=$FLOOR_PID")
    start_floor "$mode-pingora-floor" $((base + 19)) $((base + 2)) $((base + 4)) $((base + 3)) --pingora
    gateways+=("pingora-floor=$http:$((base + 19)),pid=$FLOOR_PID")
  fi
  peer=
  if [[ -n $PEER_CMD ]]; then peer=$PEER_NAME; elif [[ -n $first_alt ]]; then peer=$first_alt; fi
  if [[ $grpc == 1 ]]; then
    # The prefill's bootstrap port is sent in the legs' disaggregated_params; a `both` mock
    # ignores it (it answers a PD leg as a plain request), so nothing listens there.
    start_grpc_mock "$mode-grpc-prefill" $((base + 5)) $((base + 7)) "$ttft" "$itl"
    watch+=(--watch "grpc-prefill=$MOCK_PID")
    start_grpc_mock "$mode-grpc-decode" $((base + 6)) $((base + 8)) "$ttft" "$itl"
    watch+=(--watch "grpc-decode=$MOCK_PID")
    engines+=(--engine "$http:$((base + 7))" --engine "$http:$((base + 8))")
    start_pd_pdgate "$mode-pdgate-grpc" $((base + 14)) "grpc://127.0.0.1:$((base + 5))" \
      $((base + 4)) "grpc://127.0.0.1:$((base + 6))" "  model_path: $MODEL_DIR${GRPC_YAML:+
$GRPC_YAML}"
    gateways+=("pdgate-grpc=$http:$((base + 14)),pid=$GW_PID")
    start_peer "$mode-$PEER_GRPC_NAME" $((base + 16)) "grpc://127.0.0.1:$((base + 5))" \
      $((base + 4)) "grpc://127.0.0.1:$((base + 6))" "$PEER_GRPC_CMD"
    [[ -z $PEER_PID ]] || gateways+=("$PEER_GRPC_NAME=$http:$((base + 16)),pid=$PEER_PID")
    subject=pdgate-grpc
    peer=
    [[ -z $PEER_GRPC_CMD ]] || peer=$PEER_GRPC_NAME
  fi
  roles=(--subject "$subject")
  [[ -z $peer ]] || roles+=(--peer "$peer")
  for round in $(seq 1 "$ROUNDS"); do
    label=$mode
    [[ $ROUNDS == 1 ]] || label=$mode/r$round
    order=("${gateways[@]}")
    if (( round % 2 == 0 )); then
      order=()
      for ((i = ${#gateways[@]} - 1; i >= 0; i--)); do order+=("${gateways[i]}"); done
    fi
    targets=(--target "direct=$http:$((base + 1))")
    for g in "${order[@]}"; do targets+=(--target "$g"); done
    "$BIN/pdgate-bench" --threads "$LOADGEN_THREADS" sweep "${targets[@]}" "${roles[@]}" \
      "${watch[@]}" "${engines[@]}" \
      --mode "$label" --concurrency "$CONCURRENCY" --prompt-bytes "$PROMPTS" --stream "$STREAM" \
      --max-tokens "$MAX_TOKENS" --duration "$DURATION" --warmup "$WARMUP" \
      ${UNIQUE_PROMPTS:+--unique-prompts} \
      --json "$OUT/sweep-$mode.jsonl" --markdown /dev/null
  done
  "$BIN/pdgate-bench" table sweep "$OUT/sweep-$mode.jsonl" "${roles[@]}" >"$OUT/sweep-$mode.md"
  "$BIN/pdgate-bench" table pivot "$OUT/sweep-$mode.jsonl" "${roles[@]}" >"$OUT/sweep-$mode-pivot.md"
  cat "$OUT/sweep-$mode.jsonl" >>"$OUT/sweep.jsonl"
  cat "$OUT/sweep-$mode.md" >>"$OUT/sweep.md"
  stop_all
done

# ---- many open streams -----------------------------------------------------------------------
if [[ $STREAMS -gt 0 ]]; then
  # Two descriptors per stream in the gateway (client + decode leg), plus listeners and the
  # pooled prefill connections (a few hundred once thousands of prefills have run: with only
  # 400 spare, the last ~100 accepts of a 20,000-descriptor gateway failed with EMFILE).
  fit=$(( (NOFILE - 1000) / 2 ))
  streams=$STREAMS
  if [[ $streams -gt $fit ]]; then
    log "nofile hard limit $NOFILE fits $fit streams through a gateway, not $STREAMS: holding $fit"
    streams=$fit
  fi
  base=$((PORT_BASE + 200))
  # The prefill leg finishes at once (ITL 0); the decode leg emits a token every HOLD_ITL_MS.
  tokens=$(( (60 * 1000) / HOLD_ITL_MS + 1 ))
  start_mock hold-prefill $((base + 2)) 0 0
  start_mock hold-decode $((base + 3)) 0 "$HOLD_ITL_MS"
  # More streams than SMG's default admission bound (1024 per CPU, at least 4096): lift it.
  start_pd_pdgate hold-pdgate $((base + 10)) "http://127.0.0.1:$((base + 2))" $((base + 4)) \
    "http://127.0.0.1:$((base + 3))" "  max_concurrent_requests: 0"
  log "holding $streams open streams through pdgate"
  "$BIN/pdgate-bench" --threads "$LOADGEN_THREADS" hold --url "http://127.0.0.1:$((base + 10))" \
    --pid "$GW_PID" --label pdgate --streams "$streams" --hold "$HOLD_SECS" \
    --max-tokens "$tokens" --open-timeout 30 --json "$OUT/hold.jsonl" --markdown "$OUT/hold-pdgate.md"
  start_peer "hold-$PEER_NAME" $((base + 12)) "http://127.0.0.1:$((base + 2))" $((base + 4)) \
    "http://127.0.0.1:$((base + 3))" "$PEER_CMD"
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

# ---- the ratio table (issue 15): direct / peer / pdgate on the canned-fast engines ------------
if [[ -f $OUT/sweep-canned-fast.jsonl ]]; then
  ratio_roles=(--subject pdgate)
  [[ -z $PEER_CMD ]] || ratio_roles+=(--peer "$PEER_NAME")
  [[ $FLOOR != 1 ]] || ratio_roles+=(--floor floor --pingora-floor pingora-floor)
  {
    echo "# Gateway cost on near-zero-cost engines (canned-fast)"
    echo
    echo "$(grep '^date' "$OUT/env.txt" | cut -d' ' -f2) — $(grep -E '^(commit|binaries)' "$OUT/env.txt");" \
      "$(grep '^load average at start' "$OUT/env.txt"); $(tail -n1 "$OUT/env.txt")."
    echo "Engines: \`pdgate-bench canned-engine\` ×3 (direct = one; the gateways: prefill leg to the"
    echo "second, decode leg to the third). Points of DURATION=${DURATION} s; ROUNDS=$ROUNDS interleaved."
    echo
    "$BIN/pdgate-bench" table ratio "$OUT/sweep-canned-fast.jsonl" --hold "$OUT/hold.jsonl" \
      "${ratio_roles[@]}"
  } >"$OUT/ratio.md"
fi

# ---- plot ------------------------------------------------------------------------------------
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$ROOT/bench/plot.py" "$OUT/sweep.jsonl" "$OUT/sweep.png" && log "plot: $OUT/sweep.png"
else
  log "matplotlib not installed (pip install matplotlib): no plot"
fi
log "results: $OUT/sweep.md $OUT/sweep-*-pivot.md $OUT/hold.md $OUT/sweep.jsonl $OUT/env.txt"
cat "$OUT/sweep.md" "$OUT"/sweep-*-pivot.md
[[ -f $OUT/hold.md ]] && cat "$OUT/hold.md"
[[ -f $OUT/ratio.md ]] && cat "$OUT/ratio.md"
exit 0
