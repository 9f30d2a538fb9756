#!/usr/bin/env bash
# Installs what a fresh machine lacks to build and test pdgate: cmake (Pingora's zlib-ng build
# needs it), a C compiler, and Debian's `prometheus` (the observability tests run `promtool check
# metrics` and a real Prometheus server), and `kubectl` (Debian's `kubernetes-client`: the
# Kubernetes manifests are rendered and checked). Idempotent; safe to run on every invocation.
set -euo pipefail

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v cc >/dev/null 2>&1 || need+=(build-essential)
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || need+=(prometheus)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -q "${need[@]}" >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${need[@]}" >/dev/null; }
fi
# Optional: `kubectl kustomize` renders deploy/kubernetes in the deployment test (which reads the
# files itself when kubectl is missing), so a failed install is only a notice.
if ! command -v kubectl >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q kubernetes-client >/dev/null 2>&1 \
    || echo "setup: kubectl not installed; the manifests are checked without kustomize" >&2
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo not found (install Rust 1.85+)" >&2; exit 1; }
