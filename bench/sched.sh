#!/usr/bin/env bash
# bench/sched.sh — what the kernel does for a request: the Pingora floor (`floor-proxy
# --pingora`) and pdgate on the same canned engines at the same load (1 KB chat, c=64).
#
# cost-split.sh puts about half of pdgate's CPU in the kernel, and more of it than the Pingora
# floor's. This says which part: per request, the system calls (by name), the context switches
# (preempted while runnable, or asleep), the wake-ups, and the kernel's samples split by the
# system call they fell in, or by "preempted at return to user" (samples in the switch back to
# a thread that was preempted). Counts are taken by `perf record` of tracepoints in one load,
# samples (`perf record -g`) in a second.
#
#   SKIP_BUILD=1 bench/sched.sh               # → bench/results/sched.md (~1 min once built)
#   SKIP_BUILD=1 STREAM=on bench/sched.sh     # → bench/results/sched-stream.md
#
# Knobs: BIN_DIR / SKIP_BUILD / CARGO_TARGET_DIR / PGO / HALT_POLL_NS (as run.sh), CONCURRENCY (64), SECONDS_REC
# (4), FREQ (2999 Hz), STREAM (off), PORT_BASE (25200), OUT (bench/results; logs/ under it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results}
PORT_BASE=${PORT_BASE:-25200}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN_DIR:-$CARGO_TARGET_DIR/release}
CONCURRENCY=${CONCURRENCY:-64}
SECONDS_REC=${SECONDS_REC:-4}
FREQ=${FREQ:-2999}
STREAM=${STREAM:-off}
REPORT=$OUT/sched.md
[ "$STREAM" = off ] || REPORT=$OUT/sched-stream.md

LOG_TAG=sched
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

command -v perf >/dev/null || die "perf not installed (linux-tools)"
build_binaries
pgo_build
halt_poll_set
mkdir -p "$OUT/logs"
DATA=$OUT/logs/sched
rm -rf "$DATA"
mkdir -p "$DATA"
http=http://127.0.0.1
start_canned_pair sched
"$BIN/pdgate-bench" floor-proxy --pingora --listen "127.0.0.1:$((PORT_BASE + 11))" \
  --prefill "127.0.0.1:$((PORT_BASE + 2))" --bootstrap-port $((PORT_BASE + 4)) \
  --decode "127.0.0.1:$((PORT_BASE + 3))" --threads 2 >"$OUT/logs/sched-pingora-floor.log" 2>&1 &
PFLOOR=$!
PIDS+=("$PFLOOR")
start_pdgate sched-pdgate $((PORT_BASE + 12)) round_robin "$workers"
wait_http "$http:$((PORT_BASE + 11))/v1/chat/completions" \
  '{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}' ||
  die "the Pingora floor did not answer"

EVENTS=(-e sched:sched_switch -e sched:sched_wakeup)
for call in sendto recvfrom write writev read futex epoll_wait; do
  EVENTS+=(-e "syscalls:sys_enter_$call")
done

# record NAME PORT PID KIND: perf the target (KIND: events or samples) while it serves a load of
# SECONDS_REC, from before the load's first request to after its last, so that what perf saw is
# divided by the requests the load made (NAME-KIND.requests).
record() {
  local name=$1 port=$2 pid=$3 kind=$4 perf_args
  if [[ $kind == events ]]; then perf_args=("${EVENTS[@]}"); else perf_args=(-F "$FREQ" -g); fi
  perf record "${perf_args[@]}" -p "$pid" -o "$DATA/$name-$kind.data" >/dev/null 2>&1 &
  local rec=$!
  # perf is attached once it has written its file's header.
  local i
  for i in $(seq 1 100); do [[ -s $DATA/$name-$kind.data ]] && break; sleep 0.05; done
  [[ -s $DATA/$name-$kind.data ]] || die "perf did not attach to $name within 5 s"
  "$BIN/pdgate-bench" --threads 1 sweep --target "$name=$http:$port" --concurrency "$CONCURRENCY" \
    --prompt-bytes 1024 --stream "$STREAM" --duration "$SECONDS_REC" --warmup 0 \
    --json "$DATA/$name-$kind.json" --markdown /dev/null >/dev/null 2>&1
  kill -INT "$rec"
  wait "$rec" || true
  sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$DATA/$name-$kind.json" | tail -1 \
    >"$DATA/$name-$kind.requests"
  log "$name ($kind): $(cat "$DATA/$name-$kind.requests") requests while recorded"
}
for kind in events samples; do
  record pingora-floor $((PORT_BASE + 11)) "$PFLOOR" "$kind"
  record pdgate $((PORT_BASE + 12)) "$GW_PID" "$kind"
done
commit="$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo ' (dirty tree)')"
{
  echo "# What the kernel does for a request: the Pingora floor and pdgate (bench/sched.sh)"
  echo
  echo "$(date -u +%FT%TZ) — commit $commit; c=$CONCURRENCY, 1 KB chat, stream $STREAM," \
    "canned engines; a load of ${SECONDS_REC} s traced, then one sampled at $FREQ Hz;" \
    "load average $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "pdgate: $PDGATE_EXE; $(idle_line)."
  echo
  python3 "$ROOT/bench/sched_split.py" "$FREQ" "$DATA" pingora-floor pdgate
} >"$REPORT"
log "wrote $REPORT"
cat "$REPORT"
