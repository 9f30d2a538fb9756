# bench/lib.sh — sourced by the bench scripts: logging, the processes a script starts (all
# stopped by pid on exit), readiness polling, the release build, and pdgate's generated config.
# Expects ROOT, OUT and BIN to be set; LOG_TAG names the script in log lines.

log() { printf '[%s %s] %s\n' "${LOG_TAG:-bench}" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Every process a script starts goes in PIDS; stop_all ends them by pid (never by name).
PIDS=()
stop_all() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}

# The guest's idle polling: this VM's cpuidle driver is `haltpoll`, and its guest_halt_poll_ns
# (how long an idle vCPU polls before it halts; the kernel's default is 200000) decides what a
# wake-up costs at low load. HALT_POLL_NS=N sets it for the script's run (root only) and puts the
# old value back on exit; idle_line says what the run had, for env.txt.
HALT_POLL_FILE=/sys/module/haltpoll/parameters/guest_halt_poll_ns
HALT_POLL_WAS=
halt_poll_set() {
  [[ -n ${HALT_POLL_NS:-} ]] || return 0
  [[ -w $HALT_POLL_FILE ]] || die "HALT_POLL_NS set but $HALT_POLL_FILE is not writable here"
  HALT_POLL_WAS=$(<"$HALT_POLL_FILE")
  echo "$HALT_POLL_NS" >"$HALT_POLL_FILE" || die "could not write $HALT_POLL_FILE"
  log "guest_halt_poll_ns $HALT_POLL_WAS -> $HALT_POLL_NS (put back on exit)"
}
halt_poll_restore() {
  [[ -z $HALT_POLL_WAS ]] || echo "$HALT_POLL_WAS" >"$HALT_POLL_FILE" || true
  HALT_POLL_WAS=
}
idle_line() {
  local line
  line="idle: cpuidle driver $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo '?')"
  [[ ! -r $HALT_POLL_FILE ]] || line+=", guest_halt_poll_ns $(<"$HALT_POLL_FILE")"
  [[ -z ${HALT_POLL_NS:-} ]] || line+=" (HALT_POLL_NS)"
  echo "$line"
}
trap 'stop_all; halt_poll_restore' EXIT

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_http URL [JSON_BODY]: poll (GET, or POST with the body) until 2xx, 30 s at most.
wait_http() {
  local url=$1 i
  for i in $(seq 1 300); do
    if [[ -n ${2:-} ]]; then
      curl -sf -m 2 -o /dev/null -H 'content-type: application/json' -d "$2" "$url" && return 0
    else
      curl -sf -m 2 -o /dev/null "$url" && return 0
    fi
    sleep 0.1
  done
  return 1
}

# build_binaries: release pdgate, mock-engine and pdgate-bench (with the policy micro-benchmark, so
# run.sh and policy.sh share one build), unless SKIP_BUILD=1 or BIN_DIR points at prebuilt ones.
build_binaries() {
  if [[ ${SKIP_BUILD:-0} != 1 && -z ${BIN_DIR:-} ]]; then
    log "building release binaries (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
    (cd "$ROOT" && cargo build --release -p pdgate -p mock-engine -p pdgate-bench --bins \
      --features pdgate-bench/policy)
  fi
  local b
  for b in pdgate mock-engine pdgate-bench; do
    [[ -x $BIN/$b ]] || die "$BIN/$b missing (build, or set BIN_DIR)"
  done
}

# host_triple: rustc's host target (bench/pgo.sh builds for it alone).
host_triple() { rustc -vV | sed -n 's/^host: //p'; }

# pgo_exe: where bench/pgo.sh puts its profile-guided pdgate.
pgo_exe() { echo "$CARGO_TARGET_DIR/pgo/$(host_triple)/release/pdgate"; }

# The pdgate binary the scripts measure: $BIN/pdgate, or with PGO=1 the profile-guided build of
# bench/pgo.sh (made first unless SKIP_BUILD=1 finds one already there).
PDGATE_EXE=$BIN/pdgate
[[ ${PGO:-0} != 1 ]] || PDGATE_EXE=$(pgo_exe)

# pgo_build: bench/pgo.sh when PGO=1 asks for its build and it is missing or SKIP_BUILD is not 1.
pgo_build() {
  [[ ${PGO:-0} == 1 ]] || return 0
  if [[ ${SKIP_BUILD:-0} != 1 || ! -x $PDGATE_EXE ]]; then
    SKIP_BUILD=1 "$ROOT/bench/pgo.sh" || die "bench/pgo.sh failed"
  fi
  [[ -x $PDGATE_EXE ]] || die "$PDGATE_EXE missing after bench/pgo.sh"
}

# start_pdgate NAME PORT PREFILL_POLICY WORKERS_YAML [EXTRA_YAML]: writes $OUT/logs/NAME.yaml
# (metrics on PORT+1, round_robin decode leg unless EXTRA_YAML — more `gateway:` lines, indented
# two spaces — sets `decode_policy`) and runs pdgate (GW_EXE, default $PDGATE_EXE) on it until
# ready; sets GW_PID.
start_pdgate() {
  local name=$1 port=$2 prefill_policy=$3 workers=$4 extra=${5:-}
  port_free "$port" || die "port $port is busy (set PORT_BASE)"
  cat >"$OUT/logs/$name.yaml" <<EOF
version: 1
threads: 2
grace_period_seconds: 0
graceful_shutdown_timeout_seconds: 1
pid_file: $OUT/logs/$name.pid
upgrade_sock: $OUT/logs/$name-upgrade.sock
gateway:
  pd_disaggregation: true
  host: 127.0.0.1
  port: $port
  prometheus_host: 127.0.0.1
  prometheus_port: $((port + 1))
  policy: round_robin
  prefill_policy: $prefill_policy
  log_level: warn
$extra
  workers:
$workers
EOF
  "${GW_EXE:-$PDGATE_EXE}" run -c "$OUT/logs/$name.yaml" >"$OUT/logs/$name.log" 2>&1 &
  GW_PID=$!
  PIDS+=("$GW_PID")
  wait_http "http://127.0.0.1:$port/readiness" || die "pdgate $name not ready (see $OUT/logs/$name.log)"
}

# start_canned NAME PORT [CHUNKS]: a `pdgate-bench canned-engine` (one thread, preformatted
# answers of CHUNKS tokens, default $STREAM_CHUNKS or 16) logging to $OUT/logs/NAME.log, until it
# answers; sets MOCK_PID.
start_canned() {
  local name=$1 port=$2 chunks=${3:-${STREAM_CHUNKS:-16}}
  port_free "$port" || die "port $port is busy (set PORT_BASE)"
  "$BIN/pdgate-bench" canned-engine --host 127.0.0.1 --port "$port" \
    --stream-chunks "$chunks" >"$OUT/logs/$name.log" 2>&1 &
  MOCK_PID=$!
  PIDS+=("$MOCK_PID")
  wait_http "http://127.0.0.1:$port/health" || die "engine $name did not start (see $OUT/logs/$name.log)"
}

# pdgate's own malloc tunables (src/main.rs, tune_malloc). A wrapper that sets them before it
# runs pdgate under a tool (heaptrack, callgrind) stops pdgate's re-execution of itself, which
# the tool would not follow.
PDGATE_TUNABLES=glibc.malloc.tcache_count=32:glibc.malloc.mmap_threshold=4194304:glibc.malloc.trim_threshold=67108864

# start_canned_pair TAG: two canned engines on PORT_BASE+2 (prefill, bootstrap port PORT_BASE+4)
# and PORT_BASE+3 (decode), logging to $OUT/logs/TAG-engine-N.log; sets `workers` (their YAML).
start_canned_pair() {
  local i
  for i in 2 3; do
    start_canned "$1-engine-$i" $((PORT_BASE + i)) 16
  done
  workers="$(worker_yaml "http://127.0.0.1:$((PORT_BASE + 2))" prefill $((PORT_BASE + 4)); worker_yaml "http://127.0.0.1:$((PORT_BASE + 3))" decode)"
}

# worker_yaml URL TYPE [BOOTSTRAP_PORT [MORE]]: one `workers:` entry; MORE is more of its fields
# (`key: value, …`).
worker_yaml() {
  printf '    - {url: %s, worker_type: %s%s%s}\n' "$1" "$2" "${3:+, bootstrap_port: $3}" "${4:+, $4}"
}

# start_vllm_pair TAG: start_canned_pair's vLLM counterpart: two mock-engine vLLM engines with
# NIXL answering at once, prefill on PORT_BASE+2 and decode on PORT_BASE+3; sets `workers`.
start_vllm_pair() {
  local i role
  workers=
  for i in 2 3; do
    role=prefill
    [[ $i == 2 ]] || role=decode
    run_mock "$1-engine-$i" "http://127.0.0.1:$((PORT_BASE + i))/health" --engine vllm \
      --role "$role" --host 127.0.0.1 --port $((PORT_BASE + i)) --ttft-ms 0 --itl-ms 0
    workers+=$(worker_yaml "http://127.0.0.1:$((PORT_BASE + i))" "$role" "" \
      "runtime_type: vllm, kv_connector: NixlConnector")$'\n'
  done
}

# start_pd_pdgate NAME PORT PREFILL_URL BOOTSTRAP DECODE_URL [EXTRA_YAML]: pdgate on one prefill +
# one decode (GW_EXE, when set, is the pdgate binary); sets GW_PID.
start_pd_pdgate() {
  start_pdgate "$1" "$2" round_robin \
    "$(worker_yaml "$3" prefill "$4"; worker_yaml "$5" decode)" "${6:-}"
}

# start_grpc_mock NAME PORT CONTROL_PORT TTFT ITL: a `both` gRPC SGLang mock emitting the model
# directory's word pieces (GRPC_OUTPUT_IDS, GRPC_EOS_ID: write_model's); /mock/* on
# CONTROL_PORT; sets MOCK_PID.
# It reports MODEL_DIR as its `tokenizer_path` (GetModelInfo), as an engine reports its model's:
# SMG loads the tokenizer of a worker's served model from there (its --model-path registers the
# tokenizer under the path's name, not the served model's), else from the Hugging Face hub or the
# GetTokenizer RPC, which the mock does not serve.
start_grpc_mock() {
  local name=$1 port=$2 ctl=$3 ttft=$4 itl=$5
  port_free "$port" || die "port $port is busy (set PORT_BASE)"
  port_free "$ctl" || die "port $ctl is busy (set PORT_BASE)"
  run_mock "$name" "http://127.0.0.1:$ctl/health" --transport grpc --engine sglang --role both \
    --host 127.0.0.1 --port "$port" --control-port "$ctl" --output-ids "$GRPC_OUTPUT_IDS" \
    --eos-ids "$GRPC_EOS_ID" --tokenizer-path "$MODEL_DIR" --ttft-ms "$ttft" --itl-ms "$itl" \
    --max-model-len 1000000 --max-running-requests 100000
}

# run_mock NAME HEALTH_URL ARGS…: `mock-engine ARGS…` logging to $OUT/logs/NAME.log, until
# HEALTH_URL answers; sets MOCK_PID.
run_mock() {
  local name=$1 health=$2
  shift 2
  "$BIN/mock-engine" "$@" >"$OUT/logs/$name.log" 2>&1 &
  MOCK_PID=$!
  PIDS+=("$MOCK_PID")
  wait_http "$health" || die "mock $name did not start (see $OUT/logs/$name.log)"
}

# write_model: the gRPC gateway's tokenizer and chat template in MODEL_DIR (`pdgate-bench
# write-model`); sets GRPC_OUTPUT_IDS and GRPC_EOS_ID, the word pieces the gRPC mocks emit.
write_model() {
  local model_line
  model_line=$("$BIN/pdgate-bench" write-model "$MODEL_DIR") || die "pdgate-bench write-model failed"
  read -r GRPC_OUTPUT_IDS GRPC_EOS_ID <<<"$model_line"
}

# start_grpc_pair TAG: start_canned_pair's gRPC counterpart: write_model into
# $OUT/logs/TAG-model and two gRPC SGLang mocks answering at once on PORT_BASE+2 (prefill) and
# PORT_BASE+3 (decode), control ports PORT_BASE+6 / +7; sets `workers` and `model_yaml` (the
# gateway's `model_path:` line).
start_grpc_pair() {
  local i
  MODEL_DIR=$OUT/logs/$1-model
  write_model
  for i in 2 3; do
    start_grpc_mock "$1-engine-$i" $((PORT_BASE + i)) $((PORT_BASE + i + 4)) 0 0
  done
  workers="$(worker_yaml "grpc://127.0.0.1:$((PORT_BASE + 2))" prefill $((PORT_BASE + 4)); worker_yaml "grpc://127.0.0.1:$((PORT_BASE + 3))" decode)"
  model_yaml="  model_path: $MODEL_DIR"
}
