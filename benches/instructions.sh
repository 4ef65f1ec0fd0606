#!/usr/bin/env bash
# Instructions per telegram of a relay, counted by valgrind: a measure that
# does not move with the machine's load, to compare two builds of the hub (or
# the hub and the yardstick) on a busy or shared machine.
#
#   cargo build --release --workspace --bins --examples
#   benches/instructions.sh [hub[:JOURNAL][@BIN] | yardstick] ...
#
# Each relay runs under `valgrind --tool=callgrind` with a release corebank
# behind it; `relayhub bench` sends SHORT, then (a fresh process) LONG
# transfers at CONNECTIONS connections (2); the difference of the two totals over LONG -
# SHORT is the relay's instructions per telegram (start-up and shutdown
# cancel out). Every thread of the relay counts. Settings (environment):
# SHORT (200), LONG (1200), CONNECTIONS (2), LOG (info: the relay's RUST_LOG). Needs valgrind
# (`apt-get install valgrind`). Default: `hub:memory yardstick`.
# Instructions are not time: valgrind counts a `rep movsb` copy byte by byte
# and hides SHA extensions, so copies and hashing weigh more here than on the
# CPU; kernel time is not counted at all.
set -euo pipefail

cd "$(dirname "$0")/.."
HUB_BIN=${HUB_BIN:-target/release/relayhub}
CORE_BIN=${CORE_BIN:-target/release/corebank}
YARD_BIN=${YARD_BIN:-target/release/examples/yardstick}
SHORT=${SHORT:-200}
LONG=${LONG:-1200}
CONNECTIONS=${CONNECTIONS:-2}
LOG=${LOG:-info}
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind not found" >&2; exit 1; }
[ $# -eq 0 ] && set -- hub:memory yardstick

WORK=$(mktemp -d "${TMPDIR:-/tmp}/relayhub-instructions.XXXXXX")
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# Waits (bounded) for "listening on ADDR" in FILE; prints ADDR.
address() {
    local file=$1 i
    for i in $(seq 600); do
        if grep -q "listening on" "$file" 2>/dev/null; then
            grep -o 'listening on [0-9.:]*' "$file" | head -1 | cut -d' ' -f3
            return
        fi
        sleep 0.1
    done
    echo "instructions.sh: no 'listening on' in $file" >&2
    exit 1
}

# total RELAY N: the relay's whole instruction count over N telegrams.
total() {
    local relay=$1 n=$2 out="$WORK/run"
    "$CORE_BIN" --listen 127.0.0.1:0 >"$out.core" 2>&1 &
    local core_pid=$!
    PIDS+=("$core_pid")
    local core; core=$(address "$out.core")
    local bin=$HUB_BIN journal=memory
    case "$relay" in
        yardstick)
            valgrind --tool=callgrind --callgrind-out-file="$out.cg" \
                "$YARD_BIN" --listen 127.0.0.1:0 --core-url "http://$core" >"$out.relay" 2>&1 &
            ;;
        hub*)
            [ "${relay#*@}" != "$relay" ] && bin=${relay#*@} && relay=${relay%%@*}
            [ "${relay#hub:}" != "$relay" ] && journal=${relay#hub:}
            [ "$journal" = sqlite ] && journal="$WORK/journal-$n.sqlite"
            RUST_LOG=$LOG valgrind --tool=callgrind --callgrind-out-file="$out.cg" \
                "$bin" serve --listen 127.0.0.1:0 --core-url "http://$core" \
                --journal "$journal" >"$out.relay" 2>&1 &
            ;;
        *) echo "instructions.sh: unknown relay $relay" >&2; exit 64 ;;
    esac
    local relay_pid=$!
    PIDS+=("$relay_pid")
    local addr; addr=$(address "$out.relay")
    "$HUB_BIN" bench --to "$addr" -c "$CONNECTIONS" -n "$n" >"$out.bench" 2>&1 \
        || { echo "instructions.sh: the bench failed:" >&2; cat "$out.bench" >&2; exit 1; }
    kill -TERM "$relay_pid"; wait "$relay_pid" 2>/dev/null || true
    kill "$core_pid"; wait "$core_pid" 2>/dev/null || true
    callgrind_annotate "$out.cg" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
    rm -f "$WORK"/journal-*
}

printf '%-40s %16s\n' relay "instructions/telegram"
for relay in "$@"; do
    short=$(total "$relay" "$SHORT")
    long=$(total "$relay" "$LONG")
    printf '%-40s %16d\n' "$relay" $(( (long - short) / (LONG - SHORT) ))
done
