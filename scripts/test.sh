#!/usr/bin/env bash
# The whole test suite: unit, property and integration tests (real gateway processes and mock
# engines on loopback). Installs missing system packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Incremental state is a third of a debug build's footprint and buys a one-shot CI run nothing;
# a developer iterating can set CARGO_INCREMENTAL=1 (README, "Disk").
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
cargo test --workspace --locked "$@"
