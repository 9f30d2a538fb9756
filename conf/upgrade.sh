#!/usr/bin/env bash
# Graceful binary upgrade (Pingora's hand-over): start the new binary with -u, which waits on
# upgrade_sock for the listening sockets; then SIGQUIT the old process, which hands them over,
# stops accepting, and lets its in-flight requests and streams finish (grace_period_seconds).
# No connection is refused and no stream is cut.
#
#   conf/upgrade.sh [NEW_BINARY] [CONFIG]     (defaults: /usr/local/bin/pdgate /etc/pdgate/pdgate.yaml)
#
# The old process is found from the config's pid_file (Pingora writes it in daemon mode) or
# with PDGATE_OLD_PID. Under systemd, run the new binary as the service instead (see pdgate.service).
set -euo pipefail
new_bin=${1:-/usr/local/bin/pdgate}
conf=${2:-/etc/pdgate/pdgate.yaml}
"$new_bin" check -c "$conf"
sock=$(sed -n 's/^upgrade_sock:[[:space:]]*//p' "$conf" | tr -d '"' | head -1)
sock=${sock:-/tmp/pingora_upgrade.sock}
old_pid=${PDGATE_OLD_PID:-}
if [ -z "$old_pid" ]; then
  pid_file=$(sed -n 's/^pid_file:[[:space:]]*//p' "$conf" | tr -d '"' | head -1)
  old_pid=$(cat "${pid_file:-/tmp/pingora.pid}")
fi
rm -f "$sock"
"$new_bin" run -c "$conf" -u -d
for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { echo "upgrade: the new process did not open $sock" >&2; exit 1; }
kill -QUIT "$old_pid"
echo "upgrade: listeners handed over; old pid $old_pid drains its in-flight requests and exits"
