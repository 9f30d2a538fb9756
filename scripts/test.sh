#!/usr/bin/env bash
# The whole test suite: unit, property and integration tests (real gateway processes and mock
# engines on loopback). Installs missing system packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace --locked "$@"
