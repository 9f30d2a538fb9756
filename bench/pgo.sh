#!/usr/bin/env bash
# bench/pgo.sh — a profile-guided release build of pdgate: an instrumented build serves a
# training load (small chats, streamed and not, c=1 and c=16, on three fleets: run.sh's canned
# SGLang HTTP engines, vLLM mock engines with NIXL, and the gRPC SGLang mocks), its profile is
# merged, and pdgate is built again with it.
# The result is target/pgo/<triple>/release/pdgate; compare it with the plain build with
# PDGATE_ALT (run.sh, instructions.sh).
#
#   bench/pgo.sh                  # ~15 min clean (two release builds of pdgate + ~1 min of load)
#   PDGATE_ALT="pgo=$PWD/target/pgo/x86_64-unknown-linux-gnu/release/pdgate" SKIP_BUILD=1 \
#     NO_PEER=1 ROUNDS=5 ENGINES=canned-fast MODES=canned CONCURRENCY=1,64 STREAMS=0 bench/run.sh
#
# The build is the release profile (fat LTO, one codegen unit) with `-Cprofile-generate` /
# `-Cprofile-use` for pdgate's target only (`--target` keeps the flags off build scripts and
# proc macros, which would write profiles of their own). llvm-profdata must match rustc's LLVM:
# it is rustup's `llvm-tools` component, added when missing. The helpers (mock-engine,
# pdgate-bench) are the plain release build's (built unless SKIP_BUILD=1 or BIN_DIR is set).
#
# Knobs: SECONDS_EACH (3: each training point), PORT_BASE (25600), OUT (bench/results; logs/
# under it), PGO_DATA (target/pgo-data), BIN_DIR / SKIP_BUILD / CARGO_TARGET_DIR (as run.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results}
PORT_BASE=${PORT_BASE:-25600}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN_DIR:-$CARGO_TARGET_DIR/release}
SECONDS_EACH=${SECONDS_EACH:-3}
PGO_DATA=${PGO_DATA:-$CARGO_TARGET_DIR/pgo-data}

LOG_TAG=pgo
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
TRIPLE=$(host_triple)

profdata() {
  local tools
  tools="$(rustc --print sysroot)/lib/rustlib/$TRIPLE/bin"
  if [[ ! -x $tools/llvm-profdata ]]; then
    log "adding rustup's llvm-tools (llvm-profdata for rustc's LLVM)"
    rustup component add llvm-tools >&2 || die "rustup component add llvm-tools failed"
  fi
  echo "$tools/llvm-profdata"
}

PROFDATA=$(profdata)
build_binaries
mkdir -p "$OUT/logs"
rm -rf "$PGO_DATA"
mkdir -p "$PGO_DATA"

# build DIR FLAGS: pdgate alone, release profile, for $TRIPLE, into DIR.
build() {
  (cd "$ROOT" && CARGO_TARGET_DIR=$1 RUSTFLAGS="${RUSTFLAGS:-} $2" \
    cargo build --release --locked -p pdgate --bin pdgate --target "$TRIPLE")
}

log "instrumented build (target/pgo-gen)"
build "$CARGO_TARGET_DIR/pgo-gen" "-Cprofile-generate=$PGO_DATA"
GW_EXE=$CARGO_TARGET_DIR/pgo-gen/$TRIPLE/release/pdgate
export LLVM_PROFILE_FILE=$PGO_DATA/pdgate-%p-%m.profraw

# train NAME: the gateway (already started on $port) under small chats, each point SECONDS_EACH;
# then it is stopped as an operator does (SIGINT: it drains and exits, writing its profile), and
# the engines with it.
train() {
  local c s
  log "training on $1"
  for s in off on; do
    for c in 1 16; do
      "$BIN/pdgate-bench" --threads 1 sweep --target "$1=http://127.0.0.1:$port" \
        --concurrency "$c" --stream "$s" --prompt-bytes 1024 --duration "$SECONDS_EACH" \
        --warmup 0 --json "$OUT/logs/pgo-$1-$s-$c.json" --markdown /dev/null >/dev/null 2>&1 ||
        die "the training load on $1 failed"
    done
  done
  kill -INT "$GW_PID"
  wait "$GW_PID" 2>/dev/null || true
  stop_all
}

port=$((PORT_BASE + 10))
start_canned_pair pgo-http
start_pdgate pgo-http "$port" round_robin "$workers"
train http

port=$((PORT_BASE + 12))
start_vllm_pair pgo-vllm
start_pdgate pgo-vllm "$port" round_robin "$workers"
train vllm

port=$((PORT_BASE + 14))
start_grpc_pair pgo-grpc
start_pdgate pgo-grpc "$port" round_robin "$workers" "$model_yaml"
train grpc

shopt -s nullglob
raw=("$PGO_DATA"/*.profraw)
# One profile per fleet: a gateway that did not exit cleanly wrote none, and its fleet's paths
# would be laid out as cold code.
((${#raw[@]} == 3)) || die "want 3 profiles in $PGO_DATA (one per fleet), found ${#raw[@]}"
"$PROFDATA" merge -o "$PGO_DATA/pdgate.profdata" "${raw[@]}"
log "merged ${#raw[@]} profiles"

log "optimized build (target/pgo)"
unset LLVM_PROFILE_FILE
build "$CARGO_TARGET_DIR/pgo" "-Cprofile-use=$PGO_DATA/pdgate.profdata"
log "built $(pgo_exe)"
