#!/usr/bin/env bash
# The SQLite journal's tail after a burst: corebank and a hub with a fresh
# SQLite journal, a closed-loop burst (BURST, 10s, at 8 connections), then a
# fixed rate (RATE, 1000/s, for DURATION, 10s, at 16 connections); prints the
# burst's throughput and the fixed rate's latency percentiles. Each argument
# is a relayhub binary, run in turn and ROUNDS times (1), so builds alternate:
#   benches/burst_then_rate.sh target/release/relayhub /tmp/relayhub-before
# PAUSE (0) seconds of rest between the two parts; BURST=0 skips the burst.
# Linux only. docs/performance.md, "The tail at 1,000/s after a burst".
set -euo pipefail

cd "$(dirname "$0")/.."
CORE_BIN=${CORE_BIN:-target/release/corebank}
BURST=${BURST:-10s}
RATE=${RATE:-1000}
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-1}
PAUSE=${PAUSE:-0}
[ "$#" -gt 0 ] || set -- target/release/relayhub
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap 'cleanup; rm -rf "$WORK"' EXIT

# wait_ready, num
. benches/common.sh

printf '%-5s %-40s %10s %9s %9s %9s %9s\n' round hub "burst/s" "p50 ms" "p99 ms" "p999 ms" "wrong/na"
for round in $(seq 1 "$ROUNDS"); do
    for bin in "$@"; do
        run="$WORK/run"; rm -rf "$run"; mkdir -p "$run"
        RUST_LOG=info "$CORE_BIN" --listen 127.0.0.1:0 >"$run/core.out" 2>"$run/core.log" &
        PIDS+=("$!")
        core=$(wait_ready "$run/core.out")
        RUST_LOG=info "$bin" serve --listen 127.0.0.1:0 --core-url "http://$core" \
            --journal "$run/journal.sqlite" >"$run/hub.out" 2>"$run/hub.log" &
        PIDS+=("$!")
        hub=$(wait_ready "$run/hub.out")
        burst=-
        if [ "$BURST" != 0 ]; then
            "$bin" bench --json --to "$hub" -c 8 -d "$BURST" >"$run/burst.json" || true
            burst=$(awk "BEGIN { printf \"%.0f\", $(num "$run/burst.json" throughput) }")
        fi
        sleep "$PAUSE"
        "$bin" bench --json --to "$hub" -c 16 --rate "$RATE" -d "$DURATION" >"$run/rate.json" || true
        cleanup; PIDS=()
        r="$run/rate.json"
        printf '%-5s %-40s %10s %9.3f %9.3f %9.3f %9s\n' "$round" "$bin" "$burst" \
            "$(awk "BEGIN { print $(num "$r" p50_us) / 1000 }")" \
            "$(awk "BEGIN { print $(num "$r" p99_us) / 1000 }")" \
            "$(awk "BEGIN { print $(num "$r" p999_us) / 1000 }")" \
            "$(num "$r" wrong)/$(num "$r" errors)"
    done
done
