#!/usr/bin/env bash
# The demo: builds pdgate and the mock engines, starts a mock SGLang prefill and decode and the
# gateway on loopback from the embedded demo config, sends requests, and prints the evidence of
# the handoff (one room on both legs, PD text = single-worker reference).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --locked -p pdgate -p mock-engine --bins
exec target/release/pdgate demo "$@"
