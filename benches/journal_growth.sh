#!/usr/bin/env bash
# What the memory journal keeps per transfer: the hub's RSS before and after
# N transfers (each a new GUID, so each adds a row until the retention
# prunes it), for each hub binary given.
#
#   cargo build --release --workspace --bins
#   benches/journal_growth.sh [HUB_BIN ...]
#
# Default: target/release/relayhub. Settings (environment): N (100000
# transfers), CONNECTIONS (8), WARMUP (20000 transfers first, so that the
# allocator's arenas and the map's first growths are out of the figure).
# The map doubles at powers of two, so a figure taken across a doubling is
# a little higher than one taken between two; compare binaries at the same N.
# Linux only (/proc). Every process this script starts is stopped by its PID.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common.sh

N=${N:-100000}
CONNECTIONS=${CONNECTIONS:-8}
WARMUP=${WARMUP:-20000}
CORE_BIN=target/release/corebank
[ $# -gt 0 ] || set -- target/release/relayhub
WORK=$(mktemp -d /tmp/relayhub-growth.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

printf '%-40s %12s %12s %16s\n' hub "RSS before" "RSS after" "bytes/transfer"
for hub in "$@"; do
    "$CORE_BIN" --listen 127.0.0.1:0 >"$WORK/core.out" 2>"$WORK/core.log" &
    core_pid=$!
    PIDS+=("$core_pid")
    core=$(wait_ready "$WORK/core.out")
    RUST_LOG=warn "$hub" serve --listen 127.0.0.1:0 --core-url "http://$core" \
        --journal memory >"$WORK/hub.out" 2>"$WORK/hub.log" &
    hub_pid=$!
    PIDS+=("$hub_pid")
    addr=$(wait_ready "$WORK/hub.out")
    "$hub" bench --to "$addr" -c "$CONNECTIONS" -n "$WARMUP" >/dev/null 2>&1
    before=$(rss_kib "$hub_pid")
    "$hub" bench --to "$addr" -c "$CONNECTIONS" -n "$N" >"$WORK/bench.out" 2>&1 \
        || { echo "journal_growth.sh: the bench failed:" >&2; cat "$WORK/bench.out" >&2; exit 1; }
    after=$(rss_kib "$hub_pid")
    printf '%-40s %9d KiB %9d KiB %16d\n' "$hub" "$before" "$after" $(( (after - before) * 1024 / N ))
    kill "$hub_pid" "$core_pid"
    wait "$hub_pid" "$core_pid" 2>/dev/null || true
done
