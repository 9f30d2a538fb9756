#!/usr/bin/env bash
# Runs every cargo-fuzz target of pdgate-filters (filters/fuzz/) for a bounded time and prints,
# per target, the seconds run, the executions and the crashes found. Exits non-zero when any
# target crashed, hung or failed to run; the input that did it is kept under
# filters/fuzz/artifacts/<target>/ (replay: the `cargo fuzz run … <artifact>` line printed below).
#
#   bench/fuzz.sh                      # every target, 60 s each
#   FUZZ_SECONDS=10 bench/fuzz.sh      # shorter
#   FUZZ_TARGETS="sse logprobs" bench/fuzz.sh
#
# Knobs: FUZZ_SECONDS (60), FUZZ_TARGETS (all), FUZZ_SANITIZER (none: the crate and the targets
# are safe Rust, so ASan only slows the run; `address` works too), FUZZ_MAX_LEN (8192 bytes),
# CARGO_TARGET_DIR (target/fuzz; the growing corpus lives in $CARGO_TARGET_DIR/corpus/<target>,
# seeded read-only from filters/fuzz/seeds/<target>).
#
# Toolchain: cargo-fuzz wants nightly. With a nightly toolchain installed it is used; otherwise
# the stable one runs with RUSTC_BOOTSTRAP=1, which is enough for cargo-fuzz's flags.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FUZZ_DIR=$ROOT/filters/fuzz
SECONDS_EACH=${FUZZ_SECONDS:-60}
SANITIZER=${FUZZ_SANITIZER:-none}
MAX_LEN=${FUZZ_MAX_LEN:-8192}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/fuzz}
ALL_TARGETS="scan_rewrite classify shape routing_text sglang_leg_body vllm_legs moriio sse logprobs errors framing"
TARGETS=${FUZZ_TARGETS:-$ALL_TARGETS}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    FUZZ=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    FUZZ=(cargo fuzz)
fi
FLAGS=(--fuzz-dir "$FUZZ_DIR" -O -a -s "$SANITIZER")

echo "building fuzz targets (${FUZZ[*]}, sanitizer $SANITIZER)" >&2
"${FUZZ[@]}" build "${FLAGS[@]}" >&2

LOGS=$CARGO_TARGET_DIR/fuzz-logs
mkdir -p "$LOGS"
rows=()
failed=0
for t in $TARGETS; do
    corpus=$CARGO_TARGET_DIR/corpus/$t
    mkdir -p "$corpus"
    log=$LOGS/$t.log
    echo "fuzzing $t for ${SECONDS_EACH}s" >&2
    start=$(date +%s)
    set +e
    # -timeout: one input taking 10 s is a hang and counts as a failure.
    "${FUZZ[@]}" run "${FLAGS[@]}" "$t" "$corpus" "$FUZZ_DIR/seeds/$t" -- \
        -dict="$FUZZ_DIR/json.dict" -max_total_time="$SECONDS_EACH" -max_len="$MAX_LEN" \
        -timeout=10 -print_final_stats=1 >"$log" 2>&1
    rc=$?
    set -e
    took=$(($(date +%s) - start))
    execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
    if [ -z "$execs" ]; then
        # No final stats (killed hard): the last status line's count.
        execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#' || true)
    fi
    artifacts=$(grep -o 'Test unit written to [^ ]*' "$log" | awk '{print $NF}' || true)
    crashes=$(printf '%s' "$artifacts" | grep -c . || true)
    if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then
        crashes="run failed (rc $rc)"
    fi
    if [ "$rc" -ne 0 ] || [ "$crashes" != 0 ]; then
        failed=1
        echo "--- $t failed, log: $log" >&2
        { grep -A4 'panicked at' "$log" | grep -v '^stack backtrace' | head -8
          grep -E 'ERROR: libFuzzer|SUMMARY' "$log" | head -2; } >&2 || true
        for a in $artifacts; do
            echo "replay: ${FUZZ[*]} run ${FLAGS[*]} $t $a" >&2
        done
    fi
    rows+=("$t|$took|${execs:-?}|$crashes|${artifacts:-}")
done

printf '\n| target | seconds | executions | crashes |\n|---|---:|---:|---|\n'
for r in "${rows[@]}"; do
    IFS='|' read -r t took execs crashes _ <<<"$r"
    printf '| %s | %s | %s | %s |\n' "$t" "$took" "$execs" "$crashes"
done
exit "$failed"
