#!/usr/bin/env bash
# bench/together.sh — an A/B of two pdgate builds (or one build in two settings) loaded at the
# same time: each gateway gets its own loader with C connections, on the same canned-fast
# engines, for DURATION seconds, ROUNDS times; each round prints both gateways' CPU per request,
# and the end the median of the per-round ratios A ÷ B.
#
# On a VM whose speed moves by ±20% from one minute to the next, two builds run one after the
# other (run.sh's interleaved rounds) differ by more than a 5% change; run at once, both see the
# same minute, and the ratio within a round is what is compared.
#
#   A=target/release/pdgate B=/tmp/pdgate-before/pdgate bench/together.sh
#   # one build, two settings: B is a wrapper that sets the environment and execs the binary
#   ROUNDS=12 C=32 STREAM=on A=target/release/pdgate B=/tmp/pdgate-off bench/together.sh
#
# Knobs: A, B (executables taking `run -c FILE`; default A = this tree's release pdgate, B
# required), ROUNDS (10), C (32 connections per gateway), STREAM (off | on), DURATION (3 s),
# ANSWER_TOKENS (16: the HTTP engines' output tokens per answer, e.g. 400 for a ~2.3 KB answer),
# TRANSPORT (http | grpc: two gRPC SGLang mocks, `mock-engine --transport grpc --role both`, and
# both gateways tokenizing with `pdgate-bench write-model`'s model, as run.sh's gRPC modes),
# BIN_DIR / SKIP_BUILD / CARGO_TARGET_DIR (as run.sh), PORT_BASE (24700), OUT (bench/results;
# writes together.md and logs/ under it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results}
PORT_BASE=${PORT_BASE:-24700}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN_DIR:-$CARGO_TARGET_DIR/release}
A=${A:-$BIN/pdgate}
B=${B:?set B to the other build (an executable taking run -c FILE)}
ROUNDS=${ROUNDS:-10}
C=${C:-32}
STREAM=${STREAM:-off}
DURATION=${DURATION:-3}
ANSWER_TOKENS=${ANSWER_TOKENS:-16}
TRANSPORT=${TRANSPORT:-http}

LOG_TAG=together
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

build_binaries
mkdir -p "$OUT/logs"
http=http://127.0.0.1
extra=
case $TRANSPORT in
  http)
    for i in 2 3; do
      start_canned "together-engine-$i" $((PORT_BASE + i)) "$ANSWER_TOKENS"
    done
    scheme=http
    ;;
  grpc)
    start_grpc_pair together
    scheme=grpc
    extra=$model_yaml
    ;;
  *) die "TRANSPORT is http or grpc, not $TRANSPORT" ;;
esac
workers="$(worker_yaml "$scheme://127.0.0.1:$((PORT_BASE + 2))" prefill $((PORT_BASE + 4)); worker_yaml "$scheme://127.0.0.1:$((PORT_BASE + 3))" decode)"
GW_EXE=$A start_pdgate together-a $((PORT_BASE + 10)) round_robin "$workers" "$extra"
pid_a=$GW_PID
GW_EXE=$B start_pdgate together-b $((PORT_BASE + 12)) round_robin "$workers" "$extra"
pid_b=$GW_PID

md=$OUT/together.md
{
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg); A=$A B=$B; c=$C per gateway, stream=$STREAM, $TRANSPORT, $ANSWER_TOKENS output tokens, ${DURATION} s"
  echo
  echo "| round | A req/s | A CPU µs/req | B req/s | B CPU µs/req | A ÷ B CPU |"
  echo "|---:|---:|---:|---:|---:|---:|"
} >"$md"
ratios=()
for r in $(seq 1 "$ROUNDS"); do
  loaders=()
  for side in a b; do
    if [[ $side == a ]]; then port=$((PORT_BASE + 10)) pid=$pid_a; else port=$((PORT_BASE + 12)) pid=$pid_b; fi
    "$BIN/pdgate-bench" sweep --target "$side=$http:$port,pid=$pid" --subject "$side" \
      --concurrency "$C" --prompt-bytes 1024 --stream "$STREAM" --duration "$DURATION" \
      --warmup 0.5 --json "$OUT/logs/together-$side-r$r.jsonl" --markdown /dev/null &
    loaders+=("$!")
  done
  wait "${loaders[@]}"
  row=$(python3 - "$OUT/logs/together-a-r$r.jsonl" "$OUT/logs/together-b-r$r.jsonl" <<'EOF'
import json, sys
a, b = (json.loads(open(p).read().splitlines()[-1]) for p in sys.argv[1:3])
for side, r in (("A", a), ("B", b)):
    if r.get("errors") or r["gateway_cpu_us_per_req"] is None:
        sys.exit(f"{side}: {r.get('errors')} requests failed, e.g. {r.get('error_samples')}")
ca, cb = a["gateway_cpu_us_per_req"], b["gateway_cpu_us_per_req"]
print(f'{a["rps"]:.0f} | {ca:.0f} | {b["rps"]:.0f} | {cb:.0f} | {ca / cb:.3f}')
EOF
) || die "round $r: a gateway failed requests (logs: $OUT/logs/together-a.log, -b.log)"
  echo "| $r | $row |" >>"$md"
  ratios+=("${row##* }")
  log "round $r: $row"
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}')
below=$(printf '%s\n' "${ratios[@]}" | awk '$1 < 1 {n++} END {print n + 0}')
{
  echo
  echo "A ÷ B CPU per request: median **$median** over $ROUNDS rounds ($below of them below 1)."
} >>"$md"
cat "$md"
