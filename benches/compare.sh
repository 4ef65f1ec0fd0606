#!/usr/bin/env bash
# Side-by-side speed and memory of the hub against the core it fronts.
#
#   cargo build --release && benches/compare.sh [--slow-core] [--connections-scale] [--all]
#
# Default run: the same closed-loop load straight to the fixture (`bench --direct`)
# and through the hub, then both at one fixed rate (half the lower closed-loop
# throughput), and prints one table: throughput and its ratio, the latency the
# hub adds at p50 and p99, CPU seconds per 1,000 telegrams of each process (from
# /proc/PID/stat around each run) and the hub's peak RSS.
#   --slow-core          the fixture answers after 200 ms; 1,000 concurrent
#                        transfers: throughput against the Little's-law bound,
#                        hub RSS and threads.
#   --connections-scale  10,000 idle channel connections held open, a load
#                        through a few more: hub RSS per connection.
#   --all                all three.
# Settings (environment): CONNECTIONS (8), DURATION (10s), WARMUP (3000),
# SLOW_CONNECTIONS (1000), SLOW_DURATION (15s), IDLE (10000), LOG (info: the
# RUST_LOG of both servers; their logs go to files in the work folder).
# Linux only (/proc). Every process this script starts is stopped by its PID.
set -euo pipefail

cd "$(dirname "$0")/.."
HUB_BIN=${HUB_BIN:-target/release/relayhub}
CORE_BIN=${CORE_BIN:-target/release/corebank}
CONNECTIONS=${CONNECTIONS:-8}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-3000}
SLOW_CONNECTIONS=${SLOW_CONNECTIONS:-1000}
SLOW_DURATION=${SLOW_DURATION:-15s}
IDLE=${IDLE:-10000}
LOG=${LOG:-info}

modes=()
for arg in "$@"; do
    case "$arg" in
        --slow-core) modes+=(slow) ;;
        --connections-scale) modes+=(scale) ;;
        --all) modes=(compare slow scale) ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "compare.sh: unknown argument $arg" >&2; exit 64 ;;
    esac
done
[ ${#modes[@]} -eq 0 ] && modes=(compare)

for b in "$HUB_BIN" "$CORE_BIN"; do
    [ -x "$b" ] || { echo "compare.sh: $b not found; run cargo build --release first" >&2; exit 1; }
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/relayhub-bench.XXXXXX")
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
echo "work folder (logs, JSON reports): $WORK" >&2

TCK=$(getconf CLK_TCK)

# wait_ready FILE: the HOST:PORT of the `listening on` line, within 10 s.
wait_ready() {
    local i
    for i in $(seq 1 200); do
        if grep -q 'listening on' "$1" 2>/dev/null; then
            sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$1" | head -n1
            return 0
        fi
        sleep 0.05
    done
    echo "compare.sh: no ready line in $1" >&2
    return 1
}

# start_core NAME -> sets CORE_PID, CORE_ADDR
start_core() {
    RUST_LOG=$LOG "$CORE_BIN" --listen 127.0.0.1:0 >"$WORK/$1-core.out" 2>"$WORK/$1-core.log" &
    CORE_PID=$!; PIDS+=("$CORE_PID")
    CORE_ADDR=$(wait_ready "$WORK/$1-core.out")
}

# start_hub NAME -> sets HUB_PID, HUB_ADDR
start_hub() {
    RUST_LOG=$LOG "$HUB_BIN" serve --listen 127.0.0.1:0 --core-url "http://$CORE_ADDR" \
        --journal memory >"$WORK/$1-hub.out" 2>"$WORK/$1-hub.log" &
    HUB_PID=$!; PIDS+=("$HUB_PID")
    HUB_ADDR=$(wait_ready "$WORK/$1-hub.out")
}

stop_all() {
    cleanup
    PIDS=()
}

# cpu PID: utime+stime in clock ticks (fields 14 and 15; the command name has no spaces).
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# status PID KEY: a number from /proc/PID/status (kB for Vm*).
status() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
# num FILE KEY: the first `"KEY": number` in a JSON report.
num() { sed -n "s/^ *\"$2\": \([-0-9.e+]*\),\{0,1\}$/\1/p" "$1" | head -n1; }
calc() { awk "BEGIN { printf \"%.${2:-2}f\", $1 }"; }

# bench NAME ARGS...: runs `relayhub bench --json ARGS` into $WORK/NAME.json and
# fails loudly when an answer was wrong or missing.
bench() {
    local name=$1; shift
    local rc=0
    "$HUB_BIN" bench --json "$@" >"$WORK/$name.json" 2>"$WORK/$name.err" || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "compare.sh: bench $name exited $rc (wrong or missing answers?); see $WORK/$name.json" >&2
        grep -A3 '"wrong_examples"\|"error_examples"' "$WORK/$name.json" >&2 || cat "$WORK/$name.err" >&2
    fi
    return 0
}

# measured NAME ARGS...: a bench run with the CPU ticks of the hub and core
# around it; sets HUB_TICKS, CORE_TICKS.
measured() {
    local h0 c0
    h0=$( [ -n "${HUB_PID:-}" ] && cpu "$HUB_PID" || echo 0 )
    c0=$(cpu "$CORE_PID")
    bench "$@"
    HUB_TICKS=$(( $( [ -n "${HUB_PID:-}" ] && cpu "$HUB_PID" || echo 0 ) - h0 ))
    CORE_TICKS=$(( $(cpu "$CORE_PID") - c0 ))
}

# per1000 TICKS FILE: CPU seconds per 1,000 answered requests of a report.
per1000() {
    local n; n=$(num "$2" sent)
    calc "$1 / $TCK / ($n > 0 ? $n : 1) * 1000" 3
}

# sample PID FILE: until stopped, the peak Threads and VmRSS of PID every 100 ms.
sample() {
    local pid=$1 out=$2 t r max_t=0 max_r=0
    while kill -0 "$pid" 2>/dev/null; do
        t=$(status "$pid" Threads 2>/dev/null || echo 0); r=$(status "$pid" VmRSS 2>/dev/null || echo 0)
        [ "${t:-0}" -gt "$max_t" ] && max_t=$t
        [ "${r:-0}" -gt "$max_r" ] && max_r=$r
        echo "$max_t $max_r" >"$out"
        sleep 0.1
    done
}

run_compare() {
    echo "== direct vs through the hub: $CONNECTIONS connections, $DURATION each ==" >&2
    start_core cmp; start_hub cmp
    local direct=(--direct "http://$CORE_ADDR") hub=(--to "$HUB_ADDR")
    local common=(-c "$CONNECTIONS")
    bench cmp-warm-direct "${direct[@]}" "${common[@]}" -n "$WARMUP"
    bench cmp-warm-hub "${hub[@]}" "${common[@]}" -n "$WARMUP"

    local hub_pid=$HUB_PID; HUB_PID=
    measured cmp-direct "${direct[@]}" "${common[@]}" -d "$DURATION"
    local core_direct=$CORE_TICKS
    HUB_PID=$hub_pid
    measured cmp-hub "${hub[@]}" "${common[@]}" -d "$DURATION"
    local hub_hub=$HUB_TICKS core_hub=$CORE_TICKS

    local td th rate
    td=$(num "$WORK/cmp-direct.json" throughput); th=$(num "$WORK/cmp-hub.json" throughput)
    rate=$(awk "BEGIN { r = ($td < $th ? $td : $th) / 2; printf \"%d\", (r < 1 ? 1 : r) }")
    echo "== both at $rate/s (half the lower closed-loop throughput), $DURATION each ==" >&2
    # Enough connections that the rate never waits for a free one.
    local rc=(-c "$(( CONNECTIONS * 2 ))" --rate "$rate" -d "$DURATION")
    bench cmp-direct-rate "${direct[@]}" "${rc[@]}"
    bench cmp-hub-rate "${hub[@]}" "${rc[@]}"
    local hwm threads
    hwm=$(status "$HUB_PID" VmHWM); threads=$(status "$HUB_PID" Threads)
    stop_all

    local f_d="$WORK/cmp-direct.json" f_h="$WORK/cmp-hub.json"
    local r_d="$WORK/cmp-direct-rate.json" r_h="$WORK/cmp-hub-rate.json"
    local ms='%.3f'
    echo
    echo "relayhub vs direct: $CONNECTIONS connections, closed loop $DURATION; fixed rate $rate/s"
    printf '%-44s %14s %14s %14s\n' "" "direct" "through hub" "hub / direct"
    printf '%-44s %14s %14s %14s\n' "throughput, closed loop (req/s)" \
        "$(calc "$td" 0)" "$(calc "$th" 0)" "$(calc "$th / $td" 2)"
    for p in p50 p99; do
        printf "%-44s %14s %14s %14s\n" "latency $p, closed loop (ms)" \
            "$(calc "$(num "$f_d" ${p}_us) / 1000" 3)" "$(calc "$(num "$f_h" ${p}_us) / 1000" 3)" ""
    done
    for p in p50 p90 p99 p999; do
        local a b
        a=$(num "$r_d" ${p}_us); b=$(num "$r_h" ${p}_us)
        printf "%-44s %14s %14s %14s\n" "latency $p at $rate/s (ms)" \
            "$(calc "$a / 1000" 3)" "$(calc "$b / 1000" 3)" "$(awk "BEGIN { printf \"%+.3f\", ($b - $a) / 1000 }") added"
    done
    printf '%-44s %14s %14s %14s\n' "fixture CPU s per 1,000 requests" \
        "$(per1000 "$core_direct" "$f_d")" "$(per1000 "$core_hub" "$f_h")" ""
    printf '%-44s %14s %14s %14s\n' "hub CPU s per 1,000 telegrams" "-" \
        "$(per1000 "$hub_hub" "$f_h")" \
        "$(calc "($hub_hub / $(num "$f_h" sent)) / ($core_hub / $(num "$f_h" sent))" 2)x fixture"
    printf '%-44s %14s %14s\n' "hub peak RSS (VmHWM, MB)" "-" "$(calc "$hwm / 1024" 1)"
    printf '%-44s %14s %14s\n' "hub threads at the end" "-" "$threads"
    for f in "$f_d" "$f_h" "$r_d" "$r_h"; do
        printf '%-44s %14s\n' "wrong / no answer in $(basename "$f" .json)" \
            "$(num "$f" wrong) / $(num "$f" errors)"
    done
}

http_post() { # ADDR PATH BODY: a tiny HTTP client, so the script needs no curl.
    local host=${1%:*} port=${1##*:}
    exec 3<>"/dev/tcp/$host/$port"
    printf 'POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
        "$2" "$1" "${#3}" "$3" >&3
    cat <&3 >/dev/null
    exec 3>&-
}

run_slow() {
    echo "== slow core: 200 ms per transfer, $SLOW_CONNECTIONS concurrent, $SLOW_DURATION ==" >&2
    ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    start_core slow; start_hub slow
    local rss0 thr0
    bench slow-warm --to "$HUB_ADDR" -c 8 -n 1000
    rss0=$(status "$HUB_PID" VmRSS); thr0=$(status "$HUB_PID" Threads)
    # new_guid: today's date, then the prefix; the rule matches this run's GUIDs only.
    local prefix; prefix="$(date +%Y%m%d)SLOW"
    http_post "$CORE_ADDR" /_admin/faults \
        "{\"match\":{\"guid_prefix\":\"$prefix\",\"method\":\"POST\"},\"action\":{\"delay_ms\":200,\"phase\":\"before_apply\"}}"
    sample "$HUB_PID" "$WORK/slow-sample" & local sampler=$!
    measured slow --to "$HUB_ADDR" -c "$SLOW_CONNECTIONS" -d "$SLOW_DURATION" --guid-prefix SLOW --timeout 5s
    kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
    local hwm peak_thr peak_rss
    hwm=$(status "$HUB_PID" VmHWM)
    read -r peak_thr peak_rss <"$WORK/slow-sample"
    stop_all
    local f="$WORK/slow.json" bound
    bound=$(calc "$SLOW_CONNECTIONS / 0.2" 0)
    echo
    echo "relayhub with a slow core: 200 ms per transfer, $SLOW_CONNECTIONS concurrent transfers, $SLOW_DURATION"
    printf '%-44s %14s\n' "throughput (transfers/s)" "$(calc "$(num "$f" throughput)" 0)"
    printf '%-44s %14s\n' "Little's-law bound (concurrency / 0.2 s)" "$bound"
    printf '%-44s %14s\n' "share of the bound" "$(calc "100 * $(num "$f" throughput) / $bound" 1) %"
    for p in p50 p99 max; do
        printf '%-44s %14s\n' "latency $p (ms)" "$(calc "$(num "$f" ${p}_us) / 1000" 1)"
    done
    printf '%-44s %14s\n' "codes" "$(tr -d '\n ' <"$f" | sed -n 's/.*"codes":{\([^}]*\)}.*/\1/p')"
    printf '%-44s %14s\n' "wrong / no answer" "$(num "$f" wrong) / $(num "$f" errors)"
    printf '%-44s %14s\n' "hub RSS before -> peak (MB)" "$(calc "$rss0 / 1024" 1) -> $(calc "$peak_rss / 1024" 1)"
    printf '%-44s %14s\n' "hub VmHWM (MB)" "$(calc "$hwm / 1024" 1)"
    printf '%-44s %14s\n' "hub threads before -> peak" "$thr0 -> $peak_thr"
    printf '%-44s %14s\n' "hub RSS per concurrent transfer (KB)" \
        "$(calc "($peak_rss - $rss0) / $SLOW_CONNECTIONS" 1)"
    printf '%-44s %14s\n' "hub CPU s per 1,000 telegrams" "$(per1000 "$HUB_TICKS" "$f")"
}

run_scale() {
    echo "== $IDLE idle connections, then a load through 10 more ==" >&2
    ulimit -n $(( IDLE * 2 + 4096 )) 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $(( IDLE + 1024 )) ]; then
        echo "compare.sh: ulimit -n is $(ulimit -n); $IDLE connections need more" >&2
        return 1
    fi
    start_core scale; start_hub scale
    bench scale-warm --to "$HUB_ADDR" -c 10 -n 2000
    local rss0 thr0; rss0=$(status "$HUB_PID" VmRSS); thr0=$(status "$HUB_PID" Threads)
    "$HUB_BIN" bench --json --to "$HUB_ADDR" -c 10 -n 20000 --idle-connections "$IDLE" \
        --idle-hold 3s >"$WORK/scale.json" 2>"$WORK/scale.err" & local bpid=$!
    local i
    for i in $(seq 1 600); do
        grep -q 'idle connections open' "$WORK/scale.err" 2>/dev/null && break
        kill -0 "$bpid" 2>/dev/null || break
        sleep 0.1
    done
    sleep 2   # let the hub settle its buffers for the last connections
    local rss_idle thr_idle; rss_idle=$(status "$HUB_PID" VmRSS); thr_idle=$(status "$HUB_PID" Threads)
    wait "$bpid" || echo "compare.sh: the scale bench reported wrong or missing answers" >&2
    local rss_end hwm; rss_end=$(status "$HUB_PID" VmRSS); hwm=$(status "$HUB_PID" VmHWM)
    stop_all
    local f="$WORK/scale.json"
    echo
    echo "relayhub with $IDLE idle channel connections"
    printf '%-44s %14s\n' "hub RSS before (MB)" "$(calc "$rss0 / 1024" 1)"
    printf '%-44s %14s\n' "hub RSS with $IDLE idle connections (MB)" "$(calc "$rss_idle / 1024" 1)"
    printf '%-44s %14s\n' "RSS per idle connection (KB)" "$(calc "($rss_idle - $rss0) / $IDLE" 2)"
    printf '%-44s %14s\n' "hub threads before / with idle connections" "$thr0 / $thr_idle"
    printf '%-44s %14s\n' "throughput through 10 more (req/s)" "$(calc "$(num "$f" throughput)" 0)"
    printf '%-44s %14s\n' "latency p50 / p99 (ms)" \
        "$(calc "$(num "$f" p50_us) / 1000" 3) / $(calc "$(num "$f" p99_us) / 1000" 3)"
    printf '%-44s %14s\n' "hub RSS after the load / VmHWM (MB)" \
        "$(calc "$rss_end / 1024" 1) / $(calc "$hwm / 1024" 1)"
    printf '%-44s %14s\n' "wrong / no answer" "$(num "$f" wrong) / $(num "$f" errors)"
}

for m in "${modes[@]}"; do
    case "$m" in
        compare) run_compare ;;
        slow) run_slow ;;
        scale) run_scale ;;
    esac
done
