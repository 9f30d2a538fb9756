#!/usr/bin/env bash
# The whole test suite: unit, property and integration tests (real gateway processes and mock
# engines on loopback). Installs missing system packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Incremental state is a third of a debug build's footprint and buys a one-shot CI run nothing;
# a developer iterating can set CARGO_INCREMENTAL=1 (README, "Disk").
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# A clean build needs ~1.8 GB under target/; say so up front rather than as a linker's Bus error.
free_mb=$(df -Pm . 2>/dev/null | awk 'NR==2 {print $4}') || free_mb=""
if [ -n "$free_mb" ] && [ "$free_mb" -lt 2500 ]; then
  echo "test: only ${free_mb} MB free here; a clean build and run needs ~1.8 GB (README, \"Disk\")" >&2
fi
cargo test --workspace --locked "$@"
